-- `challenge_passed`: the auth service reports that a person passed the step-up of a login
-- challenge; the context becomes known to the account.
ALTER TABLE auth_events DROP CONSTRAINT auth_events_kind_check;
ALTER TABLE auth_events ADD CONSTRAINT auth_events_kind_check
    CHECK (kind IN ('login_failure', 'login_success', 'challenge_passed'));
