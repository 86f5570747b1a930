-- Which engine moved each op family's bytes.
-- duckdb -c "SET VARIABLE run = 'zcta-runs/<run id>'" -c ".read analysis/sql/path_mix.sql"
select op, coalesce(engine, 'not measured') as engine, count(*) as ops
from read_parquet(getvariable('run') || '/ops/*.parquet', union_by_name = true)
where result = 0
group by all
order by op, ops desc;
