//! Commands that talk to a running instance over its API: lockouts, lists and tokens, as an
//! analyst or an operator works with them. The URL and token come from `--url` / `--token`
//! or `PALISADE_URL` / `PALISADE_TOKEN`; output is a table for people, `--json` for scripts.

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

/// Where the instance is and who asks.
#[derive(Debug, Args)]
pub struct Remote {
    /// Base URL of a running instance, e.g. `http://127.0.0.1:8080`.
    #[arg(
        long,
        global = true,
        env = "PALISADE_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// An API token of the role the command needs (analyst or admin).
    #[arg(long, global = true, env = "PALISADE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `palisade lockouts …`.
#[derive(Debug, Subcommand)]
pub enum LockoutsCommand {
    /// List lockouts, newest first.
    List {
        /// `active` (default), `released`, `expired` or `all`.
        #[arg(long)]
        status: Option<String>,
        /// Only this account.
        #[arg(long)]
        account: Option<String>,
    },
    /// Release one lockout (audited).
    Release {
        /// The lockout id.
        id: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
}

/// `palisade lists …`.
#[derive(Debug, Subcommand)]
pub enum ListsCommand {
    /// The entries of `allow` or `deny`.
    List {
        /// `allow` or `deny`.
        list: String,
    },
    /// Add an entry (audited).
    Add {
        /// `allow` or `deny`.
        list: String,
        /// An IP, CIDR, `AS64500`, `user:…` or `device:…` value.
        value: String,
        /// Why (kept with the entry).
        #[arg(long)]
        reason: String,
        /// RFC 3339 time it ends; default never.
        #[arg(long)]
        expires_at: Option<String>,
    },
    /// Remove an entry (audited).
    Remove {
        /// `allow` or `deny`.
        list: String,
        /// The entry id.
        id: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
}

/// `palisade tokens …` (admin).
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create a token and print it once (audited; the instance stores it hashed).
    Create {
        /// A name unique among active tokens.
        name: String,
        /// `ingest`, `limiter`, `analyst` or `admin`.
        #[arg(long)]
        role: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token (audited).
    Revoke {
        /// The token id.
        id: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
}

impl Remote {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        let token = self
            .token
            .as_deref()
            .context("set --token or PALISADE_TOKEN to an API token")?;
        let mut request = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .build()?
            .request(method.clone(), &url)
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let message = value["error"]["message"].as_str().unwrap_or("no message");
            let code = value["error"]["code"].as_str().unwrap_or("");
            anyhow::bail!("{method} {path}: {status} {code}: {message}");
        }
        Ok(value)
    }

    fn print(&self, value: &Value, columns: &[&str]) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
            return;
        }
        let rows: Vec<&Value> = match value.get("items").and_then(Value::as_array) {
            Some(items) => items.iter().collect(),
            None => vec![value],
        };
        println!("{}", table(&rows, columns));
    }
}

/// Rows as an aligned plain-text table of `columns` (missing values as `-`).
pub fn table(rows: &[&Value], columns: &[&str]) -> String {
    let cell = |row: &Value, column: &str| match &row[column] {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let widths: Vec<usize> = columns
        .iter()
        .map(|c| {
            rows.iter()
                .map(|r| cell(r, c).chars().count())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(text, width)| format!("{text:<width$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = vec![line(columns.iter().map(|c| c.to_uppercase()).collect())];
    out.extend(
        rows.iter()
            .map(|row| line(columns.iter().map(|c| cell(row, c)).collect())),
    );
    out.join("\n")
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Runs a lockouts command.
pub async fn lockouts(remote: &Remote, command: LockoutsCommand) -> anyhow::Result<()> {
    match command {
        LockoutsCommand::List { status, account } => {
            let mut query = vec![];
            if let Some(status) = status {
                query.push(format!("status={}", encode(&status)));
            }
            if let Some(account) = account {
                query.push(format!("account={}", encode(&account)));
            }
            let path = format!("/v1/lockouts?{}", query.join("&"));
            let page = remote.call(reqwest::Method::GET, &path, None).await?;
            remote.print(
                &page,
                &["id", "account", "reason", "failures", "locked_until"],
            );
        }
        LockoutsCommand::Release { id, reason } => {
            let path = format!("/v1/lockouts/{}/release", encode(&id));
            let released = remote
                .call(
                    reqwest::Method::POST,
                    &path,
                    Some(json!({ "reason": reason })),
                )
                .await?;
            remote.print(&released, &["id", "account", "released_at", "released_by"]);
        }
    }
    Ok(())
}

/// Runs a lists command.
pub async fn lists(remote: &Remote, command: ListsCommand) -> anyhow::Result<()> {
    let columns = ["id", "kind", "value", "reason", "expires_at"];
    match command {
        ListsCommand::List { list } => {
            let page = remote
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/lists/{}", encode(&list)),
                    None,
                )
                .await?;
            remote.print(&page, &columns);
        }
        ListsCommand::Add {
            list,
            value,
            reason,
            expires_at,
        } => {
            let mut body = json!({ "value": value, "reason": reason });
            if let Some(at) = expires_at {
                body["expires_at"] = json!(at);
            }
            let path = format!("/v1/lists/{}", encode(&list));
            let entry = remote
                .call(reqwest::Method::POST, &path, Some(body))
                .await?;
            remote.print(&entry, &columns);
        }
        ListsCommand::Remove { list, id, reason } => {
            let path = format!(
                "/v1/lists/{}/{}?reason={}",
                encode(&list),
                encode(&id),
                encode(&reason)
            );
            let removed = remote.call(reqwest::Method::DELETE, &path, None).await?;
            remote.print(&removed, &columns);
        }
    }
    Ok(())
}

/// `palisade overrides …`.
#[derive(Debug, Subcommand)]
pub enum OverridesCommand {
    /// The overrides in force.
    List,
    /// Set one subject's multiplier until a time (audited).
    Set {
        /// `user:…`, `ip:…`, `device:…` or `tenant:…`.
        subject: String,
        /// The multiplier it sets (0–1000).
        #[arg(long)]
        multiplier: f64,
        /// Classes it applies to, comma-separated (default: every class).
        #[arg(long, value_delimiter = ',')]
        classes: Vec<String>,
        /// RFC 3339 time it ends.
        #[arg(long)]
        expires_at: String,
        /// Why (kept in the audit log and the explanation).
        #[arg(long)]
        reason: String,
    },
    /// Remove an override (audited).
    Remove {
        /// The override id.
        id: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
}

/// Runs an overrides command.
pub async fn overrides(remote: &Remote, command: OverridesCommand) -> anyhow::Result<()> {
    let columns = [
        "id",
        "subject",
        "classes",
        "multiplier",
        "expires_at",
        "message",
    ];
    match command {
        OverridesCommand::List => {
            let page = remote
                .call(reqwest::Method::GET, "/v1/overrides", None)
                .await?;
            remote.print(&page, &columns);
        }
        OverridesCommand::Set {
            subject,
            multiplier,
            classes,
            expires_at,
            reason,
        } => {
            let (kind, id) = subject
                .split_once(':')
                .context("subject must be user:…, ip:…, device:… or tenant:…")?;
            let field = match kind {
                "user" => "account",
                "ip" => "ip",
                "device" => "device_id",
                "tenant" => "tenant",
                _ => anyhow::bail!("subject must be user:…, ip:…, device:… or tenant:…"),
            };
            let body = json!({
                field: id, "multiplier": multiplier, "classes": classes,
                "expires_at": expires_at, "reason": reason,
            });
            let created = remote
                .call(reqwest::Method::POST, "/v1/overrides", Some(body))
                .await?;
            remote.print(&created, &columns);
        }
        OverridesCommand::Remove { id, reason } => {
            let path = format!("/v1/overrides/{}?reason={}", encode(&id), encode(&reason));
            let removed = remote.call(reqwest::Method::DELETE, &path, None).await?;
            remote.print(&removed, &columns);
        }
    }
    Ok(())
}

/// `palisade export PROVIDER [--out FILE]`: the instance's edge rules, as served.
pub async fn export(
    remote: &Remote,
    provider: &str,
    out: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let value = remote
        .call(
            reqwest::Method::GET,
            &format!("/v1/export/{}", encode(provider)),
            None,
        )
        .await?;
    let text = match &value {
        Value::String(vcl) => vcl.clone(),
        json => serde_json::to_string_pretty(json)? + "\n",
    };
    match out {
        Some(path) => std::fs::write(path, text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}

/// Runs a tokens command.
pub async fn tokens(remote: &Remote, command: TokensCommand) -> anyhow::Result<()> {
    let columns = ["id", "name", "role", "created_at", "revoked_at"];
    match command {
        TokensCommand::Create { name, role, reason } => {
            let body = serde_json::json!({"name": name, "role": role, "reason": reason});
            let created = remote
                .call(reqwest::Method::POST, "/v1/admin/tokens", Some(body))
                .await?;
            remote.print(&created, &["id", "name", "role", "token"]);
        }
        TokensCommand::List => {
            let page = remote
                .call(reqwest::Method::GET, "/v1/admin/tokens", None)
                .await?;
            remote.print(&page, &columns);
        }
        TokensCommand::Revoke { id, reason } => {
            let path = format!(
                "/v1/admin/tokens/{}?reason={}",
                encode(&id),
                encode(&reason)
            );
            let revoked = remote.call(reqwest::Method::DELETE, &path, None).await?;
            remote.print(&revoked, &columns);
        }
    }
    Ok(())
}
