-- Which engine moved each op family's bytes.
-- duckdb -c "SET VARIABLE run = 'zcta-runs/<run id>'" -c ".read analysis/sql/path_mix.sql"
.read analysis/sql/views/zcta_ops.sql
select op, coalesce(engine, 'not measured') as engine, count(*) as ops
from zcta_ops
where result = 0
group by all
order by op, ops desc;
