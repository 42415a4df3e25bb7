//! Deployment files: the systemd unit verifies, the container image checks its own health and
//! keeps the build context small, the compose file checks every service.

use std::process::Command;

use crate::helpers::repo_file;

/// `systemd-analyze verify` of `deploy/systemd/palisade.service`, pointed at the built binary.
#[test]
fn the_systemd_unit_verifies() {
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "CI=true but systemd-analyze is missing (.ci/run installs it)"
        );
        eprintln!("SKIPPED: systemd-analyze is not installed");
        return;
    };
    assert!(version.status.success());
    let unit = std::fs::read_to_string(repo_file("deploy/systemd/palisade.service")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/palisade", env!("CARGO_BIN_EXE_palisade")),
    )
    .unwrap();
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Unknown keys are only warnings to systemd: none is allowed here.
    assert!(
        !stderr.contains("palisade.service"),
        "systemd-analyze warns: {stderr}"
    );
    assert!(unit.contains("UMask=0077"));
}

#[test]
fn the_image_checks_its_health_and_listens_for_grpc_everywhere() {
    let dockerfile = std::fs::read_to_string(repo_file("Dockerfile")).unwrap();
    assert!(dockerfile.contains("HEALTHCHECK"), "{dockerfile}");
    assert!(dockerfile.contains(r#"CMD ["palisade", "health"]"#));
    assert!(dockerfile.contains("PALISADE_GRPC_LISTEN=0.0.0.0:8081"));
    assert!(dockerfile.contains("USER palisade"));
    let ignored = std::fs::read_to_string(repo_file(".dockerignore")).unwrap();
    assert!(ignored.lines().any(|l| l.trim() == "target/"), "{ignored}");
    let compose = std::fs::read_to_string(repo_file("docker-compose.yml")).unwrap();
    // Every service (two-space indented names under `services:`) has a healthcheck.
    let services = compose
        .split("\nservices:\n")
        .nth(1)
        .unwrap()
        .split("\nnetworks:")
        .next()
        .unwrap();
    let names: Vec<&str> = services
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   ") && l.ends_with(':'))
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(
        services.matches("    healthcheck:").count(),
        3,
        "{services}"
    );
    assert!(compose.contains("PALISADE_TRUSTED_PROXIES"));
}

fn kube(file: &str) -> serde_yaml_ng::Value {
    let text = std::fs::read_to_string(repo_file(&format!("deploy/kubernetes/{file}"))).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn s(v: &serde_yaml_ng::Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// The Kubernetes base: every manifest is valid for Kubernetes 1.37 (`kubernetes-validate
/// --strict`, the API's published schemas; the ServiceMonitor is a CRD and is checked
/// below), and the pieces fit: probes on `/livez`, `/readyz` and gRPC health, selectors that
/// select the pods, ports that exist, the Secret the pods read, the image's user.
#[test]
fn the_kubernetes_base_is_valid_and_its_pieces_fit() {
    let kustomization = kube("kustomization.yaml");
    let resources: Vec<&str> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    for file in &resources {
        assert!(
            repo_file(&format!("deploy/kubernetes/{file}")).is_file(),
            "{file}"
        );
    }
    let validator = Command::new("kubernetes-validate")
        .arg("--version")
        .output();
    if validator.is_ok_and(|o| o.status.success()) {
        let core: Vec<std::path::PathBuf> = resources
            .iter()
            .filter(|f| **f != "servicemonitor.yaml")
            .map(|f| repo_file(&format!("deploy/kubernetes/{f}")))
            .collect();
        let output = Command::new("kubernetes-validate")
            .args(["--strict", "--kubernetes-version", "1.37.0"])
            .args(&core)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // The validator bites: a misspelt probe field is refused.
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.yaml");
        let deployment =
            std::fs::read_to_string(repo_file("deploy/kubernetes/deployment.yaml")).unwrap();
        std::fs::write(
            &bad,
            deployment.replace("periodSeconds: 10", "periodSecond: 10"),
        )
        .unwrap();
        let refused = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet"])
            .arg(&bad)
            .output()
            .unwrap();
        assert!(!refused.status.success());
    } else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "CI=true but kubernetes-validate is missing (.ci/run installs it)"
        );
        eprintln!("SKIPPED schema validation: pip install kubernetes-validate");
    }

    let deployment = kube("deployment.yaml");
    let pod = &deployment["spec"]["template"];
    let pod_labels = &pod["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], pod_labels);
    let container = &pod["spec"]["containers"][0];
    let ports: Vec<(&str, u64)> = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| (s(&p["name"]), p["containerPort"].as_u64().unwrap()))
        .collect();
    assert_eq!(ports, [("http", 8080), ("grpc", 8081)]);
    assert_eq!(s(&container["livenessProbe"]["httpGet"]["path"]), "/livez");
    assert_eq!(
        s(&container["readinessProbe"]["httpGet"]["path"]),
        "/readyz"
    );
    assert_eq!(
        container["startupProbe"]["grpc"]["port"].as_u64(),
        Some(8081)
    );
    let env: Vec<(&str, &str)> = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| (s(&e["name"]), s(&e["value"])))
        .collect();
    assert!(
        env.contains(&("PALISADE_GRPC_LISTEN", "0.0.0.0:8081")),
        "{env:?}"
    );
    assert!(
        env.contains(&("PALISADE_LISTEN", "0.0.0.0:8080")),
        "{env:?}"
    );
    // Every variable set is a real setting.
    let reference = std::fs::read_to_string(repo_file("docs/CONFIGURATION.md")).unwrap();
    let secret = kube("secret.yaml");
    let secret_keys: Vec<&str> = secret["stringData"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(s)
        .collect();
    for name in env
        .iter()
        .map(|(n, _)| *n)
        .chain(secret_keys.iter().copied())
    {
        assert!(
            reference.contains(&format!("`{name}`")),
            "{name} is not a setting"
        );
    }
    assert_eq!(
        s(&container["envFrom"][0]["secretRef"]["name"]),
        s(&secret["metadata"]["name"])
    );
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    let uid = pod["spec"]["securityContext"]["runAsUser"]
        .as_u64()
        .unwrap();
    let dockerfile = std::fs::read_to_string(repo_file("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!("--uid {uid}")),
        "the image's user is {uid}"
    );

    let service = kube("service.yaml");
    assert_eq!(&service["spec"]["selector"], pod_labels);
    let service_ports: Vec<&str> = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            let target = s(&p["targetPort"]);
            assert!(ports.iter().any(|(name, _)| *name == target), "{target}");
            s(&p["name"])
        })
        .collect();
    let pdb = kube("poddisruptionbudget.yaml");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], pod_labels);
    let monitor = kube("servicemonitor.yaml");
    assert_eq!(s(&monitor["apiVersion"]), "monitoring.coreos.com/v1");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][s(key)],
            value,
            "the monitor selects the Service"
        );
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert!(service_ports.contains(&s(&endpoint["port"])));
    assert_eq!(s(&endpoint["path"]), "/metrics");
}
