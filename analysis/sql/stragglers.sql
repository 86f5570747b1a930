-- Per collective, the rank whose GPU started last and by how much (one host's clock;
-- `zcta report` aligns hosts).
-- duckdb -c "SET VARIABLE run = 'zcta-runs/<run id>'" -c ".read analysis/sql/stragglers.sql"
.read analysis/sql/views/zcta_ops.sql
with c as (
  select comm_id, seq, rank, gpu_start_ns
  from zcta_ops
  where op not in ('Send', 'Recv') and seq is not null and gpu_start_ns is not null
),
-- Each collective's first and last GPU start (the same as a window over (comm_id, seq),
-- which DuckDB does not turn into this aggregate over the rows kept above).
spans as (
  select comm_id, seq, max(gpu_start_ns) as last_start, min(gpu_start_ns) as first_start
  from c
  group by comm_id, seq
)
select c.comm_id, rank as last_rank, count(*) as times_last,
       median(last_start - first_start) / 1e3 as median_wait_us
from c join spans on c.comm_id is not distinct from spans.comm_id and c.seq = spans.seq
where gpu_start_ns = last_start and last_start > first_start
group by all
order by times_last desc;
