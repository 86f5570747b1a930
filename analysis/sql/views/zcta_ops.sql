-- The view zcta_ops that the ops recipes read: path_mix.sql and stragglers.sql begin
-- with `.read analysis/sql/views/zcta_ops.sql` (so they run from the repository's
-- root). It holds the ops files and rows zcta_analysis reads
-- (analysis/zcta_analysis/__init__.py), the others left out silently: files whose
-- footer gives no zcta.schema_version, a bad one or a newer one than 2 (its
-- SCHEMA_VERSION; `_version`), or another zcta.table than ops (`_footer_problem`); rows
-- with a time outside [0, 2^62) ns (TIME_COLUMNS["ops"], MAX_TIME_NS) or of a call that
-- succeeded with bytes of 2^62 or more (MAX_BYTES): the `where` of `ops` is the text of
-- `_rules_sql("ops", ...)`. Not checked here: a column of another type, a required
-- column missing or NULL (a file that is not Parquet stops the query).
-- zcta_analysis.connect(run) applies every rule and names what it leaves out.
create or replace temp view zcta_ops as
with files as (
  select file_name from (
    select file_name,
           cast(first(value) filter (where key = 'zcta.schema_version') as varchar) as version,
           first(value) filter (where key = 'zcta.table') as tbl
    from parquet_kv_metadata(getvariable('run') || '/ops/*.parquet')
    group by file_name)
  where regexp_full_match(version, '\+?[0-9]+') and try_cast(version as uinteger) <= 2
    and coalesce(tbl = 'ops', true)
),
ops as (
  select * from (
    from read_parquet(getvariable('run') || '/ops/*.parquet', union_by_name = true, filename = true)
    -- The judged columns a file of an older zcta lacks read as NULL (in range).
    union all by name
    select null::bigint as api_start_ns, null::bigint as api_end_ns, null::bigint as launch_ns,
           null::bigint as gpu_ready_ns, null::bigint as gpu_start_ns, null::bigint as gpu_end_ns,
           null::ubigint as bytes, null::integer as result
    where false)
  where filename in (from files)
    and (coalesce("api_start_ns" >= 0 and "api_start_ns" < 4611686018427387904, true)
     and coalesce("api_end_ns" >= 0 and "api_end_ns" < 4611686018427387904, true)
     and coalesce("launch_ns" >= 0 and "launch_ns" < 4611686018427387904, true)
     and coalesce("gpu_ready_ns" >= 0 and "gpu_ready_ns" < 4611686018427387904, true)
     and coalesce("gpu_start_ns" >= 0 and "gpu_start_ns" < 4611686018427387904, true)
     and coalesce("gpu_end_ns" >= 0 and "gpu_end_ns" < 4611686018427387904, true))
    and (coalesce("result" <> 0, false) or coalesce("bytes" < 4611686018427387904, true))
)
select * from ops;
