-- The macro zcta_files(tbl): the run's files of table `tbl` that zcta_analysis reads
-- (analysis/zcta_analysis/__init__.py), the others left out silently: files whose
-- footer gives no zcta.schema_version, a bad one or a newer one than 2 (its
-- SCHEMA_VERSION; `_version`), or another zcta.table than `tbl` (`_footer_problem`).
-- Only the table directory's top level is read, and a copy of a file there under
-- another name is read again (zcta and zcta_analysis read a copy once, `_skip_copies`).
-- Read by views/zcta_ops.sql and phase_breakdown.sql (`.read`, from the repository's
-- root).
create or replace temp macro zcta_files(tbl) as table
  select file_name from (
    select file_name,
           cast(first(value) filter (where key = 'zcta.schema_version') as varchar) as version,
           first(value) filter (where key = 'zcta.table') as t
    from parquet_kv_metadata(getvariable('run') || '/' || tbl || '/*.parquet')
    group by file_name)
  where regexp_full_match(version, '\+?[0-9]+') and try_cast(version as uinteger) <= 2
    and coalesce(t = tbl, true);
