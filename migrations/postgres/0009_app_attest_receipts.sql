-- An App Attest key keeps the receipt Apple issued with its attestation (for fraud-risk
-- queries to Apple), and a device id is looked up by its key.
ALTER TABLE app_attest_keys ADD COLUMN receipt TEXT NOT NULL DEFAULT '';
CREATE INDEX app_attest_keys_device ON app_attest_keys (device_id);
