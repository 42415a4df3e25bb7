-- Tenants (`tenant:` subjects: the partner or app a request is made for): the traffic
-- record keeps each check's tenant as a keyed pseudonym, like users and devices, so a replay
-- runs budgets with `scope = "tenant"` as they ran.
ALTER TABLE traffic_record ADD COLUMN tenant_key TEXT;
