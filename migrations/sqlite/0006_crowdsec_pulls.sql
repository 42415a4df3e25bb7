-- CrowdSec bouncers (module `crowdsec`): when each API token last pulled the decisions
-- stream, so `startup=false` answers only what changed since (on any instance).
CREATE TABLE crowdsec_pulls (
    token_id      TEXT PRIMARY KEY,
    last_pull_ms  BIGINT NOT NULL
);
