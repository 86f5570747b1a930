-- Per collective, the rank whose GPU started last and by how much (one host's clock;
-- `zcta report` aligns hosts).
-- duckdb -c "SET VARIABLE run = 'zcta-runs/<run id>'" -c ".read analysis/sql/stragglers.sql"
with c as (
  select comm_id, seq, rank, gpu_start_ns,
         max(gpu_start_ns) over (partition by comm_id, seq) as last_start,
         min(gpu_start_ns) over (partition by comm_id, seq) as first_start
  from read_parquet(getvariable('run') || '/ops/*.parquet', union_by_name = true)
  where op not in ('Send', 'Recv') and seq is not null and gpu_start_ns is not null
)
select comm_id, rank as last_rank, count(*) as times_last,
       median(last_start - first_start) / 1e3 as median_wait_us
from c where gpu_start_ns = last_start and last_start > first_start
group by all
order by times_last desc;
