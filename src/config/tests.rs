//! Loading, validation and the example file against the settings.

#![expect(
    clippy::result_large_err,
    reason = "figment::Jail's closure returns figment::Error"
)]

use super::*;
use figment::Jail;

fn load_in_jail(jail: &mut Jail, toml: Option<&str>) -> Result<Settings, SettingError> {
    let path = toml.map(|text| {
        jail.create_file("custom.toml", text).expect("write toml");
        PathBuf::from("custom.toml")
    });
    Settings::load(path.as_deref())
}

#[test]
fn defaults_match_the_contract() {
    Jail::expect_with(|jail| {
        let settings = load_in_jail(jail, None).expect("defaults load");
        assert_eq!(settings.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(settings.database_url, "sqlite://palisade.db");
        assert!(settings.redis_url.is_none());
        assert_eq!(settings.data_dir, PathBuf::from("data"));
        Ok(())
    });
}

#[test]
fn env_wins_over_file() {
    Jail::expect_with(|jail| {
        jail.set_env("PALISADE_LISTEN", "127.0.0.1:9999");
        jail.set_env("PALISADE_HTTP__BODY_LIMIT_BYTES", "2048");
        let settings = load_in_jail(jail, Some("listen = \"127.0.0.1:7777\"\n")).expect("loads");
        assert_eq!(settings.listen.port(), 9999);
        assert_eq!(settings.http.body_limit_bytes, 2048);
        Ok(())
    });
}

#[test]
fn bad_listen_names_the_env_variable_on_one_line() {
    Jail::expect_with(|jail| {
        jail.set_env("PALISADE_LISTEN", "abc");
        let err = load_in_jail(jail, None).expect_err("must fail");
        let line = err.to_string();
        assert!(line.starts_with("PALISADE_LISTEN"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        Ok(())
    });
}

#[test]
fn unknown_toml_key_is_reported_with_the_file() {
    Jail::expect_with(|jail| {
        let err = load_in_jail(jail, Some("lisen = \"127.0.0.1:1\"\n")).expect_err("typo");
        let line = err.to_string();
        assert!(line.contains("lisen"), "{line}");
        assert!(line.contains("unknown setting"), "{line}");
        Ok(())
    });
}

#[test]
fn unknown_env_variable_is_reported_but_test_variables_are_skipped() {
    Jail::expect_with(|jail| {
        jail.set_env("PALISADE_TEST_DATABASE_URL", "postgres://x@y/z");
        jail.set_env("PALISADE_CONFIG", "whatever.toml");
        load_in_jail(jail, None).expect("test variables are not settings");
        jail.set_env("PALISADE_LISTN", "127.0.0.1:1");
        let err = load_in_jail(jail, None).expect_err("typo");
        assert!(err.to_string().starts_with("PALISADE_LISTN"), "{err}");
        Ok(())
    });
}

#[test]
fn wrong_schemes_are_rejected_with_what_is_accepted() {
    Jail::expect_with(|jail| {
        jail.set_env("PALISADE_DATABASE_URL", "mysql://root:hunter2@db/x");
        let err = load_in_jail(jail, None).expect_err("mysql");
        let line = err.to_string();
        assert!(line.starts_with("PALISADE_DATABASE_URL"), "{line}");
        assert!(line.contains("postgres://"), "{line}");
        assert!(!line.contains("hunter2"), "password leaked: {line}");
        jail.set_env("PALISADE_DATABASE_URL", "sqlite://x.db");
        jail.set_env("PALISADE_REDIS_URL", "http://localhost");
        let err = load_in_jail(jail, None).expect_err("http");
        assert!(err.to_string().starts_with("PALISADE_REDIS_URL"), "{err}");
        jail.set_env("PALISADE_REDIS_URL", "");
        let settings = load_in_jail(jail, None).expect("empty = in-process");
        assert!(settings.redis_url.is_none());
        Ok(())
    });
}

#[test]
fn short_bootstrap_token_and_zero_limits_are_rejected() {
    Jail::expect_with(|jail| {
        jail.set_env("PALISADE_BOOTSTRAP_TOKEN", "short");
        let err = load_in_jail(jail, None).expect_err("short token");
        assert!(err.to_string().starts_with("PALISADE_BOOTSTRAP_TOKEN"));
        jail.set_env("PALISADE_BOOTSTRAP_TOKEN", "a-long-enough-bootstrap-token");
        jail.set_env("PALISADE_HTTP__BODY_LIMIT_BYTES", "0");
        let err = load_in_jail(jail, None).expect_err("zero body limit");
        assert!(err.to_string().contains("BODY_LIMIT_BYTES"), "{err}");
        jail.set_env("PALISADE_HTTP__BODY_LIMIT_BYTES", "65536");
        jail.set_env("PALISADE_LIMITS__COALESCE_IN_FLIGHT", "0");
        let err = load_in_jail(jail, None).expect_err("no call may go to Redis");
        assert!(err.to_string().contains("COALESCE_IN_FLIGHT"), "{err}");
        jail.set_env("PALISADE_LIMITS__COALESCE_IN_FLIGHT", "2");
        let settings = load_in_jail(jail, None).expect("loads");
        assert_eq!(settings.limits.coalesce_in_flight, 2);
        Ok(())
    });
}

#[test]
fn a_present_but_blank_identity_secret_is_an_error_not_off() {
    Jail::expect_with(|jail| {
        for blank in [" , ", "", "  ", ",", "0123456789abcdef0123456789abcdef, "] {
            jail.set_env("PALISADE_FORWARD_AUTH__IDENTITY_SECRET", blank);
            let err = load_in_jail(jail, None).expect_err("blank secret");
            assert!(
                err.to_string()
                    .starts_with("PALISADE_FORWARD_AUTH__IDENTITY_SECRET")
                    && err.to_string().contains("blank"),
                "{blank:?}: {err}"
            );
        }
        jail.set_env(
            "PALISADE_FORWARD_AUTH__IDENTITY_SECRET",
            " 0123456789abcdef0123456789abcdef , fedcba9876543210fedcba9876543210",
        );
        let settings = load_in_jail(jail, None).expect("two secrets");
        assert_eq!(settings.forward_auth.identity_secret.len(), 2);
        Ok(())
    });
    Jail::expect_with(|jail| {
        let err = load_in_jail(jail, Some("[forward_auth]\nidentity_secret = [\"\"]\n"))
            .expect_err("blank in TOML");
        assert!(err.to_string().contains("blank"), "{err}");
        Ok(())
    });
}

#[test]
fn trusted_proxies_accept_a_comma_separated_env_value() {
    Jail::expect_with(|jail| {
        jail.set_env("PALISADE_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.1");
        let settings = load_in_jail(jail, None).expect("loads");
        assert_eq!(settings.trusted_proxies.len(), 2);
        jail.set_env("PALISADE_TRUSTED_PROXIES", "10.0.0.0/8,banana");
        let err = load_in_jail(jail, None).expect_err("bad cidr");
        assert!(
            err.to_string().starts_with("PALISADE_TRUSTED_PROXIES"),
            "{err}"
        );
        assert!(err.to_string().contains("banana"), "{err}");
        Ok(())
    });
}

#[test]
fn budgets_from_toml_replace_the_defaults() {
    Jail::expect_with(|jail| {
        let toml = "[[limits.budgets]]\nname = \"only\"\nscope = \"ip\"\nlimit = 3\nperiod_s = 1\n";
        let settings = load_in_jail(jail, Some(toml)).expect("loads");
        assert_eq!(settings.limits.budgets.len(), 1);
        let bad = "[[limits.budgets]]\nname = \"x\"\nscope = \"planet\"\nlimit = 3\nperiod_s = 1\n";
        let err = load_in_jail(jail, Some(bad)).expect_err("bad scope");
        assert!(err.to_string().contains("planet"), "{err}");
        Ok(())
    });
}

#[test]
fn missing_named_config_file_is_an_error() {
    let err = Settings::load(Some(Path::new("/nonexistent/palisade.toml"))).expect_err("no file");
    assert!(err.to_string().starts_with("--config"), "{err}");
}

#[test]
fn example_config_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("palisade.example.toml");
    let figment =
        Figment::from(Serialized::defaults(Settings::default())).merge(Toml::file_exact(&path));
    Settings::from_figment(&figment).expect("palisade.example.toml must parse and validate");
}

/// Every key of the defaults, as dotted paths (`lockout.window_s`), leaving out unset
/// options and the insides of lists.
fn leaves(value: &serde_json::Value, prefix: &str, out: &mut Vec<(String, serde_json::Value)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                if inner.is_object() && !inner.as_object().is_some_and(|m| m.is_empty()) {
                    leaves(inner, &path, out);
                } else if !inner.is_null() {
                    out.push((path, inner.clone()));
                }
            }
        }
        other => out.push((prefix.to_owned(), other.clone())),
    }
}

/// Found by the `config` fuzz target: TOML parse errors quote the source over several
/// lines; a settings error is one line.
#[test]
fn toml_parse_errors_are_one_line() {
    let text = "[attestation.factors]\nstrong = 1.5\n[attestation.factors]\n";
    let figment =
        Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(text));
    let err = Settings::from_figment(&figment).unwrap_err().to_string();
    assert!(!err.contains('\n'), "{err}");
    assert!(err.contains("duplicate key"), "{err}");
    assert_eq!(
        one_line("a\n  |\n3 | x = [\n  |   ^\nbad\nworse"),
        "a: bad; worse"
    );
    assert_eq!(one_line("key\u{7}bell"), "key\\u{7}bell");
}

#[test]
fn example_config_lists_every_setting_with_its_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("palisade.example.toml");
    let written: serde_json::Value = Figment::from(Toml::file_exact(&path))
        .extract()
        .expect("the example is TOML");
    let defaults = serde_json::to_value(Settings::default()).expect("serialisable");
    let mut expected = Vec::new();
    leaves(&defaults, "", &mut expected);
    let mut found = Vec::new();
    leaves(&written, "", &mut found);
    for (key, _) in &expected {
        assert!(
            found.iter().any(|(k, _)| k == key),
            "palisade.example.toml does not document {key}"
        );
    }
    // And every value written is the default (lists compared as parsed, so a budget may
    // leave out fields that have defaults).
    let parsed: Settings = Figment::from(Toml::file_exact(&path))
        .extract()
        .expect("the example parses");
    let parsed = serde_json::to_value(parsed).expect("serialisable");
    let mut values = Vec::new();
    leaves(&parsed, "", &mut values);
    for (key, value) in &expected {
        let got = values.iter().find(|(k, _)| k == key).map(|(_, v)| v);
        assert_eq!(got, Some(value), "palisade.example.toml: {key}");
    }
}

#[test]
fn an_unverified_device_may_not_be_trusted_more_than_a_failed_one_on_public_classes() {
    Jail::expect_with(|jail| {
        let text = "[attestation.public_factors]\nstrong = 1.5\ndevice = 1.0\nbasic = 0.75\n\
                    failed = 0.25\nunverified = 0.5\n";
        let err = load_in_jail(jail, Some(text)).unwrap_err().to_string();
        assert!(err.contains("public_factors.unverified"), "{err}");
        Ok(())
    });
}

#[test]
fn shared_ip_settings_are_checked() {
    Jail::expect_with(|jail| {
        let err = load_in_jail(jail, Some("[limits.shared_ip]\nceiling = 0.5\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("LIMITS__SHARED_IP__CEILING"), "{err}");
        let err = load_in_jail(jail, Some("[lockout]\nnetwork_spray_accounts = 300\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("network_spray_accounts"), "{err}");
        Ok(())
    });
}

#[test]
fn http_workers_default_to_one_per_core_and_are_bounded() {
    Jail::expect_with(|jail| {
        let settings = load_in_jail(jail, None).expect("defaults load");
        assert_eq!(settings.http.workers, 0);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(settings.http.worker_count(), cores);
        jail.set_env("PALISADE_HTTP__WORKERS", "1");
        assert_eq!(
            load_in_jail(jail, None)
                .expect("1 loads")
                .http
                .worker_count(),
            1
        );
        jail.set_env("PALISADE_HTTP__WORKERS", "257");
        let line = load_in_jail(jail, None)
            .expect_err("257 refused")
            .to_string();
        assert!(line.contains("PALISADE_HTTP__WORKERS"), "{line}");
        assert!(line.contains("at most 256"), "{line}");
        Ok(())
    });
}

#[test]
fn redis_urls_of_every_supported_kind_load_and_others_are_named_without_their_password() {
    for url in [
        "redis://127.0.0.1:6379/2",
        "rediss://cache.example:6380",
        "redis+unix:///run/redis/redis.sock?db=3&pass=secret",
        "redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/palisade",
    ] {
        Jail::expect_with(|jail| {
            jail.set_env("PALISADE_REDIS_URL", url);
            let settings = load_in_jail(jail, None).expect("loads");
            assert_eq!(settings.redis_url.as_deref(), Some(url));
            Ok(())
        });
    }
    Jail::expect_with(|jail| {
        jail.set_env("PALISADE_REDIS_URL", "http://user:hunter2@127.0.0.1:6379");
        let error = load_in_jail(jail, None)
            .expect_err("not a Redis URL")
            .to_string();
        assert!(error.contains("redis_url"), "{error}");
        assert!(error.contains("redis+unix:///PATH"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        Ok(())
    });
}
