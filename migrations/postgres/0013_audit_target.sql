-- An account's timeline and data-subject requests find the audit entries about a subject
-- or a lockout by their target.
CREATE INDEX audit_log_target ON audit_log (target, id);
