-- Needs the run's phases table: run `zcta phases zcta-runs/<run id>` first (without
-- it the first query stops with "no phases table ...: run `zcta phases ...` first").
-- Phase shares of the summed end-to-end window per (op, size bucket, engine); NULL
-- share: not measured.
-- duckdb -c "SET VARIABLE run = 'zcta-runs/<run id>'" -c ".read analysis/sql/phase_breakdown.sql"
-- The phases files zcta_analysis reads (analysis/zcta_analysis/__init__.py), the others
-- left out silently: those zcta_files('phases') leaves out (views/zcta_files.sql: their
-- footers). Its row rules judge no column of phases (`_rules_sql("phases",
-- ...)` is true): `zcta phases` writes no row for an op they leave out. Not checked
-- here: a column of another type, a required column missing or NULL (a file that is not
-- Parquet stops the query). zcta_analysis.connect(run) applies every rule and names
-- what it leaves out.
set variable phases_files = (
  select case when count(*) = 0 then error('no phases table in ' || getvariable('run')
              || ': run `zcta phases ' || getvariable('run') || '` first') else count(*) end
  from glob(getvariable('run') || '/phases/*.parquet'));
.read analysis/sql/views/zcta_files.sql
select op,
       cast(pow(2, floor(log2(greatest(bytes, 1)))) as bigint) as size,
       coalesce(engine, 'not measured') as engine,
       count(*) as ops,
       median(window_ns) / 1e3 as p50_us,
       sum(init_ns) / sum(window_ns) as init,
       sum(queue_ns) / sum(window_ns) as queue,
       sum(sync_ns) / sum(window_ns) as sync,
       sum(barrier_ns) / sum(window_ns) as barrier,
       sum(transfer_ns) / sum(window_ns) as transfer,
       sum(memcpy_ns) / sum(window_ns) as memcpy,
       sum(proxy_ns) / sum(window_ns) as proxy,
       sum(unresolved_ns) / sum(window_ns) as unresolved
from read_parquet(getvariable('run') || '/phases/*.parquet', union_by_name = true, filename = true)
where window_ns is not null and filename in (from zcta_files('phases'))
group by all
order by op, size;
