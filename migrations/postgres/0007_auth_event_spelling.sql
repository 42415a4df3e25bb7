-- The account of an auth event is stored by its canonical id (model::Identifiers); when the
-- auth service spelled it differently, the spelling received is kept beside it for analysts.
ALTER TABLE auth_events ADD COLUMN account_received TEXT;
