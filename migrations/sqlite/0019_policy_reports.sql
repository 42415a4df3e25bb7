-- What the live limiter answered each recorded check (0 allowed, 1 refused, 2 challenged)
-- and the multipliers it applied (`ip=0.5 user=0`, the ones that are not 1), so a replay
-- holds the day's signals and a suggestion knows which keys were flagged. NULL in rows
-- recorded before.
ALTER TABLE traffic_record ADD COLUMN outcome INTEGER;
ALTER TABLE traffic_record ADD COLUMN multipliers TEXT;

-- The canary's report as the instance that ended it had counted it (JSON), kept when it is
-- promoted or discarded: `GET /v1/policy/candidates/last` and the audit entry show it.
ALTER TABLE policy_candidates ADD COLUMN report TEXT;
