//! Generated documents are checked, not trusted: `docs/CONFIGURATION.md` is made from the
//! settings' own doc comments and defaults, so it cannot drift from the code. Run with
//! `UPDATE_DOCS=1` to rewrite it after changing a setting.

use std::collections::BTreeMap;

/// Per settings struct: its fields in source order, each with its type and doc comment.
type Structs = BTreeMap<String, Vec<(String, String, String)>>;

/// Reads every `pub struct …` of `src/config/*.rs`: the `///` lines above each `pub field:`.
fn settings_structs() -> Structs {
    let dir = crate::helpers::repo_file("src/config");
    let mut structs = Structs::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut current: Option<String> = None;
        let mut doc: Vec<String> = Vec::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if let Some(rest) = trimmed.strip_prefix("pub struct ") {
                current = Some(
                    rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                        .next()
                        .unwrap()
                        .to_owned(),
                );
                doc.clear();
                continue;
            }
            if trimmed == "}" {
                current = None;
            }
            if let Some(text) = trimmed.strip_prefix("///") {
                doc.push(text.trim().to_owned());
                continue;
            }
            if trimmed.starts_with("#[") {
                continue;
            }
            if let (Some(name), Some(field)) = (&current, trimmed.strip_prefix("pub "))
                && let Some((field, ty)) = field.split_once(':')
                && !field.contains('(')
            {
                let ty = ty.trim().trim_end_matches(',').to_owned();
                structs.entry(name.clone()).or_default().push((
                    field.trim().to_owned(),
                    ty,
                    doc.join("\n"),
                ));
            }
            doc.clear();
        }
    }
    structs
}

/// A doc comment as one table cell: the paragraphs joined, the line that repeats the TOML
/// key and env variable dropped (the table has columns for them).
fn cell(doc: &str) -> String {
    doc.split("\n\n")
        .flat_map(|p| p.split('\n'))
        .collect::<Vec<_>>()
        .join(" ")
        .split(". ")
        .filter(|sentence| !sentence.trim_start().starts_with("TOML `"))
        .collect::<Vec<_>>()
        .join(". ")
        .replace('|', "\\|")
        .trim()
        .to_owned()
}

fn default_cell(value: &serde_json::Value) -> String {
    let text = match value {
        serde_json::Value::Null => return "unset".to_owned(),
        serde_json::Value::String(s) if s.is_empty() => "\"\"".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.len() > 60 {
        "see `palisade.example.toml`".to_owned()
    } else {
        format!("`{}`", text.replace('|', "\\|"))
    }
}

fn rows(
    structs: &Structs,
    name: &str,
    value: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    let Some(fields) = structs.get(name) else {
        return;
    };
    for (field, ty, doc) in fields {
        let key = if path.is_empty() {
            field.clone()
        } else {
            format!("{path}.{field}")
        };
        let default = value.get(field).unwrap_or(&serde_json::Value::Null);
        if structs.contains_key(ty.as_str()) && default.is_object() {
            rows(structs, ty, default, &key, out);
            continue;
        }
        let env = format!("PALISADE_{}", key.replace('.', "__").to_uppercase());
        let shown = if key == "bootstrap_token" {
            "unset".to_owned()
        } else {
            default_cell(default)
        };
        out.push(format!("| `{key}` | `{env}` | {shown} | {} |", cell(doc)));
    }
}

fn generated() -> String {
    let structs = settings_structs();
    let defaults = serde_json::to_value(palisade::Settings::default()).unwrap();
    let mut out = Vec::new();
    rows(&structs, "Settings", &defaults, "", &mut out);
    format!(
        "# Configuration reference\n\n\
         Generated from the settings' doc comments and defaults (`src/config/`) by the test\n\
         `docs::the_configuration_reference_is_generated_from_the_code`; do not edit by hand\n\
         (`UPDATE_DOCS=1 cargo test --test api docs` rewrites it). Every setting is read from the\n\
         TOML file (`--config PATH`, or `palisade.toml` if present) and from its environment\n\
         variable, which wins; a wrong or unknown one stops the process with one line naming it.\n\
         [`palisade.example.toml`](../palisade.example.toml) shows them all in TOML.\n\n\
         | setting | environment | default | meaning |\n|---|---|---|---|\n{}\n",
        out.join("\n")
    )
}

#[test]
fn the_configuration_reference_is_generated_from_the_code() {
    let path = crate::helpers::repo_file("docs/CONFIGURATION.md");
    let want = generated();
    if std::env::var("UPDATE_DOCS").is_ok() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/CONFIGURATION.md is stale: run UPDATE_DOCS=1 cargo test --test api docs"
    );
    // Every leaf setting is in it, the sections' included.
    for key in [
        "listen",
        "http.account_ids",
        "lockout.window_s",
        "store.db_timeout_ms",
    ] {
        assert!(want.contains(&format!("| `{key}` |")), "{key}");
    }
}

/// The Python signer in docs/GUIDE.md ("Signed identity") makes identities Palisade accepts.
#[test]
fn the_documented_python_signer_interoperates() {
    let guide = std::fs::read_to_string(crate::helpers::repo_file("docs/GUIDE.md")).unwrap();
    let section = guide.split("### Signed identity").nth(1).unwrap();
    let code = section
        .split("```python\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a python block");
    let secret = "doc-identity-secret-0123456789abcdef";
    let script = format!("{code}\nprint(identity(b\"{secret}\", \"alice\", \"phone-1\"))\n");
    let Ok(output) = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
    else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "CI=true but python3 is missing"
        );
        eprintln!("SKIPPED: no python3");
        return;
    };
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let identity = crate::helpers::verify_identity_now(secret, &text);
    assert_eq!(identity.user.as_deref(), Some("alice"));
    assert_eq!(identity.device.as_deref(), Some("phone-1"));
}

/// Every operation has its own `operationId` that says what it does (generated clients name
/// their methods after it): unique, and more than one word except for the probes.
#[test]
fn operation_ids_are_unique_and_say_what_they_do() {
    let doc = serde_json::to_value(palisade::api::openapi()).unwrap();
    let mut seen = std::collections::HashSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let Some(id) = operation.get("operationId").and_then(|v| v.as_str()) else {
                panic!("{method} {path} has no operationId");
            };
            assert!(seen.insert(id.to_owned()), "{id} twice");
            assert!(
                id.contains('_') || ["healthz", "readyz", "livez", "metrics"].contains(&id),
                "{method} {path}: operationId {id} says too little"
            );
        }
    }
    assert!(seen.contains("limit_check"));
}

/// `docs/gateways/palisade_identity.py` signs what Palisade verifies, from the command line
/// and as a WSGI middleware that drops a client's own header.
#[test]
fn the_python_identity_module_signs_what_palisade_verifies() {
    let secret = "python-module-secret-0123456789ab";
    let module = crate::helpers::repo_file("docs/gateways/palisade_identity.py");
    let Ok(cli) = std::process::Command::new("python3")
        .arg(&module)
        .args([secret, "bob", "tablet-7", "60"])
        .output()
    else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "CI=true but python3 is missing"
        );
        eprintln!("SKIPPED: no python3");
        return;
    };
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let identity =
        crate::helpers::verify_identity_now(secret, &String::from_utf8(cli.stdout).unwrap());
    assert_eq!(
        (identity.user.as_deref(), identity.device.as_deref()),
        (Some("bob"), Some("tablet-7"))
    );
    assert_eq!(identity.tenant, None);
    // With a tenant: a v2 identity.
    let cli = std::process::Command::new("python3")
        .arg(&module)
        .args([secret, "bob", "", "60", "acme"])
        .output()
        .unwrap();
    let text = String::from_utf8(cli.stdout).unwrap();
    assert!(text.starts_with("v2."), "{text}");
    let identity = crate::helpers::verify_identity_now(secret, &text);
    assert_eq!(
        (identity.user.as_deref(), identity.tenant.as_deref()),
        (Some("bob"), Some("acme"))
    );
    let script = format!(
        "import sys\nsys.path.insert(0, {dir:?})\nfrom palisade_identity import SignIdentity\n\
         seen = {{}}\n\
         def app(environ, start_response):\n    seen.update(environ)\n    return []\n\
         signed = SignIdentity(app, b{secret:?}, lambda env: (env['REMOTE_USER'], None))\n\
         signed({{'REMOTE_USER': 'carol', 'HTTP_X_PALISADE_IDENTITY': 'v1.9999999999.Zm9yZ2Vk..AAAA'}}, None)\n\
         print(seen['HTTP_X_PALISADE_IDENTITY'])\n\
         anonymous = SignIdentity(app, b{secret:?}, lambda env: None)\n\
         seen.clear()\n\
         anonymous({{'HTTP_X_PALISADE_IDENTITY': 'v1.forged'}}, None)\n\
         print('HTTP_X_PALISADE_IDENTITY' in seen)\n",
        dir = module.parent().unwrap().display().to_string(),
    );
    let output = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let mut lines = text.lines();
    let identity = crate::helpers::verify_identity_now(secret, lines.next().unwrap());
    assert_eq!(
        identity.user.as_deref(),
        Some("carol"),
        "the client's header was replaced"
    );
    assert_eq!(identity.device, None);
    assert_eq!(
        lines.next(),
        Some("False"),
        "an anonymous caller's header is dropped"
    );
}

/// `docs/gateways/palisade_identity.lua` (Envoy's Lua filter) signs what Palisade verifies:
/// run with Debian's LuaJIT (Envoy's Lua), with a stand-in for Envoy's request handle.
#[test]
fn the_envoy_lua_filter_signs_what_palisade_verifies() {
    if std::process::Command::new("luajit")
        .arg("-v")
        .output()
        .is_err()
    {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "CI=true but luajit is missing (.ci/run installs it)"
        );
        eprintln!("SKIPPED: apt-get install luajit");
        return;
    }
    let dir = crate::helpers::repo_file("docs/gateways");
    // A long secret too (HMAC hashes keys over 64 bytes first).
    for secret in ["lua-filter-secret-0123456789abcdef", &"k".repeat(100)] {
        let script = format!(
            r#"package.path = "{dir}/?.lua;" .. package.path
local palisade = require("palisade_identity")
-- Envoy's header map: a header may hold several values (a table here); get joins them.
local function handle(values)
  local headers = {{
    get = function(_, name)
      local v = values[name]
      if type(v) == "table" then return table.concat(v, ",") end
      return v
    end,
    getNumValues = function(_, name)
      local v = values[name]
      if v == nil then return 0 elseif type(v) == "table" then return #v end
      return 1
    end,
    remove = function(_, name) values[name] = nil end,
    add = function(_, name, value) values[name] = value end,
  }}
  return {{ headers = function() return headers end }}
end
local signed = {{ ["x-verified-user"] = "dana", ["x-device-id"] = "phone-9",
  ["x-palisade-identity"] = "v1.9999999999.Zm9yZ2Vk..AAAA" }}
palisade.on_request(handle(signed), "{secret}", "x-verified-user", 60)
print(signed["x-palisade-identity"])
local anonymous = {{ ["x-palisade-identity"] = "v1.forged" }}
palisade.on_request(handle(anonymous), "{secret}", "x-verified-user", 60)
print(tostring(anonymous["x-palisade-identity"]))
local tenant = {{ ["x-verified-user"] = "erin", ["x-verified-tenant"] = "acme-app" }}
palisade.on_request(handle(tenant), "{secret}", "x-verified-user", 60, "x-verified-tenant")
print(tenant["x-palisade-identity"])
-- A client's own copy beside the verified value (jwt_authn appends): nothing is signed.
local injected = {{ ["x-verified-user"] = {{ "victim", "mallory" }} }}
palisade.on_request(handle(injected), "{secret}", "x-verified-user", 60)
print(tostring(injected["x-palisade-identity"]))
local injected_tenant = {{ ["x-verified-user"] = "mallory",
  ["x-verified-tenant"] = {{ "big-partner", "mallory-app" }} }}
palisade.on_request(handle(injected_tenant), "{secret}", "x-verified-user", 60, "x-verified-tenant")
print(tostring(injected_tenant["x-palisade-identity"]))
"#,
            dir = dir.display()
        );
        let output = std::process::Command::new("luajit")
            .args(["-e", &script])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).unwrap();
        let mut lines = text.lines();
        let identity = crate::helpers::verify_identity_now(secret, lines.next().unwrap());
        assert_eq!(identity.user.as_deref(), Some("dana"));
        assert_eq!(identity.device.as_deref(), Some("phone-9"));
        assert_eq!(
            lines.next(),
            Some("nil"),
            "an unauthenticated caller's header is dropped"
        );
        let tenant = lines.next().unwrap();
        assert!(tenant.starts_with("v2."), "{tenant}");
        let identity = crate::helpers::verify_identity_now(secret, tenant);
        assert_eq!(identity.user.as_deref(), Some("erin"));
        assert_eq!(identity.tenant.as_deref(), Some("acme-app"));
        for case in ["an injected user", "an injected tenant"] {
            assert_eq!(lines.next(), Some("nil"), "{case}: nothing signed");
        }
    }
}
