-- The view zcta_ops that the ops recipes read: path_mix.sql and stragglers.sql begin
-- with `.read analysis/sql/views/zcta_ops.sql` (so they run from the repository's
-- root). It holds the ops files and rows zcta_analysis reads
-- (analysis/zcta_analysis/__init__.py), the others left out silently: files that
-- zcta_files('ops') leaves out (views/zcta_files.sql: their footers); rows
-- with a time outside [0, 2^62) ns (TIME_COLUMNS["ops"], MAX_TIME_NS) or of a call that
-- succeeded with bytes of 2^62 or more (MAX_BYTES): the `where` of `ops` is the text of
-- `_rules_sql("ops", ...)`. Not checked here: a column of another type, a required
-- column missing or NULL (a file that is not Parquet stops the query).
-- zcta_analysis.connect(run) applies every rule and names what it leaves out.
.read analysis/sql/views/zcta_files.sql
create or replace temp view zcta_ops as
with ops as (
  select * from (
    from read_parquet(getvariable('run') || '/ops/*.parquet', union_by_name = true, filename = true)
    -- The judged columns a file of an older zcta lacks read as NULL (in range).
    union all by name
    select null::bigint as api_start_ns, null::bigint as api_end_ns, null::bigint as launch_ns,
           null::bigint as gpu_ready_ns, null::bigint as gpu_start_ns, null::bigint as gpu_end_ns,
           null::ubigint as bytes, null::integer as result
    where false)
  where filename in (from zcta_files('ops'))
    and (coalesce("api_start_ns" >= 0 and "api_start_ns" < 4611686018427387904, true)
     and coalesce("api_end_ns" >= 0 and "api_end_ns" < 4611686018427387904, true)
     and coalesce("launch_ns" >= 0 and "launch_ns" < 4611686018427387904, true)
     and coalesce("gpu_ready_ns" >= 0 and "gpu_ready_ns" < 4611686018427387904, true)
     and coalesce("gpu_start_ns" >= 0 and "gpu_start_ns" < 4611686018427387904, true)
     and coalesce("gpu_end_ns" >= 0 and "gpu_end_ns" < 4611686018427387904, true))
    and (coalesce("result" <> 0, false) or coalesce("bytes" < 4611686018427387904, true))
)
select * from ops;
