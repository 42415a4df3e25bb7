-- Several regions sharing this database (module `regions`, docs/MULTI-REGION.md).
--
-- A change a region must hear of (a lockout made, extended or released; a stored factor set
-- or retracted; a list entry added or removed) is announced on the channel
-- `palisade_changes` when its transaction commits: {"t": table, "k": key, "r": region}. The
-- region is the writer's `application_name` (`palisade/<region>`), so a region skips what it
-- wrote itself. Only connections that set `palisade.regions` to `on` (instances with
-- `regions.name`) announce anything: one region pays nothing for it.
CREATE FUNCTION palisade_announce_change() RETURNS trigger AS $$
DECLARE
    changed RECORD;
    key TEXT := '';
BEGIN
    IF coalesce(current_setting('palisade.regions', true), '') <> 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        changed := OLD;
    ELSE
        changed := NEW;
    END IF;
    IF TG_TABLE_NAME = 'factors' THEN
        key := changed.subject;
    ELSIF TG_TABLE_NAME = 'lockouts' THEN
        key := changed.account;
    END IF;
    PERFORM pg_notify('palisade_changes', json_build_object(
        't', TG_TABLE_NAME,
        'k', key,
        'r', coalesce(current_setting('application_name', true), '')
    )::text);
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER factors_announce AFTER INSERT OR UPDATE OR DELETE ON factors
    FOR EACH ROW EXECUTE FUNCTION palisade_announce_change();
CREATE TRIGGER lockouts_announce AFTER INSERT OR UPDATE OR DELETE ON lockouts
    FOR EACH ROW EXECUTE FUNCTION palisade_announce_change();
CREATE TRIGGER list_entries_announce AFTER INSERT OR UPDATE OR DELETE ON list_entries
    FOR EACH ROW EXECUTE FUNCTION palisade_announce_change();

-- Leased shares of the global budgets: each instance's demand for a key over its last
-- renewal period (`regions.renew_ms`), which every region reads to size its share.
CREATE TABLE region_demand (
    budget   TEXT NOT NULL,
    subject  TEXT NOT NULL,
    origin   TEXT NOT NULL,
    region   TEXT NOT NULL,
    demand   DOUBLE PRECISION NOT NULL,
    at_ms    BIGINT NOT NULL,
    PRIMARY KEY (budget, subject, origin)
);
CREATE INDEX region_demand_at ON region_demand (at_ms);
