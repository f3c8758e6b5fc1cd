//! Field validation of the decoded kubeadm documents, as kubeadm validates them: each problem
//! is reported with its field path, and checking goes on so every problem is listed at once.

use super::types::*;
use crate::validate;

/// Where a check reports a problem: the field path (if any) and the message.
type Report<'a> = dyn FnMut(Option<String>, String) + 'a;

fn check(report: &mut Report<'_>, field: &str, ok: bool, message: impl Into<String>) {
    if !ok {
        report(Some(field.to_owned()), message.into());
    }
}

fn check_duration(report: &mut Report<'_>, field: &str, value: Option<&String>) {
    if let Some(v) = value {
        check(
            report,
            field,
            validate::parse_go_duration(v).is_some(),
            format!("{v:?} is not a duration such as 24h0m0s or 5m"),
        );
    }
}

fn check_timeouts(report: &mut Report<'_>, t: Option<&Timeouts>) {
    let Some(t) = t else { return };
    for (name, v) in [
        (
            "controlPlaneComponentHealthCheck",
            &t.control_plane_component_health_check,
        ),
        ("kubeletHealthCheck", &t.kubelet_health_check),
        ("kubernetesAPICall", &t.kubernetes_api_call),
        ("etcdAPICall", &t.etcd_api_call),
        ("tlsBootstrap", &t.tls_bootstrap),
        ("discovery", &t.discovery),
        ("upgradeManifests", &t.upgrade_manifests),
    ] {
        check_duration(report, &format!("timeouts.{name}"), v.as_ref());
    }
}

fn check_args(report: &mut Report<'_>, field: &str, args: &[Arg]) {
    for (i, a) in args.iter().enumerate() {
        check(
            report,
            &format!("{field}[{i}].name"),
            !a.name.is_empty() && !a.name.starts_with('-'),
            format!(
                "{:?}: required, the flag name without leading dashes",
                a.name
            ),
        );
    }
}

fn check_envs(report: &mut Report<'_>, field: &str, envs: &[EnvVar]) {
    for (i, e) in envs.iter().enumerate() {
        check(
            report,
            &format!("{field}[{i}].name"),
            !e.name.is_empty(),
            "required",
        );
    }
}

fn check_volumes(report: &mut Report<'_>, field: &str, volumes: &[HostPathMount]) {
    for (i, v) in volumes.iter().enumerate() {
        let f = |n: &str| format!("{field}[{i}].{n}");
        check(
            report,
            &f("name"),
            validate::is_dns1123_label(&v.name),
            format!("{:?} is not a DNS-1123 label", v.name),
        );
        check(
            report,
            &f("hostPath"),
            v.host_path.starts_with('/'),
            "required, an absolute path",
        );
        check(
            report,
            &f("mountPath"),
            v.mount_path.starts_with('/'),
            "required, an absolute path",
        );
    }
}

fn check_api_endpoint(report: &mut Report<'_>, field: &str, e: &ApiEndpoint) {
    if e.advertise_address.is_empty() {
        report(
            Some(format!("{field}.advertiseAddress")),
            "required by the stand-in: it cannot detect the node's address as kubeadm would".into(),
        );
    } else {
        let ip = e.advertise_address.parse::<std::net::IpAddr>();
        check(
            report,
            &format!("{field}.advertiseAddress"),
            ip.as_ref().is_ok_and(|ip| !ip.is_unspecified()),
            format!("{:?} is not a usable IP address", e.advertise_address),
        );
    }
    check(
        report,
        &format!("{field}.bindPort"),
        e.bind_port == 0 || validate::is_port(e.bind_port),
        format!("{} is not a port between 1 and 65535", e.bind_port),
    );
}

fn check_node_registration(report: &mut Report<'_>, n: &NodeRegistrationOptions) {
    let f = |s: &str| format!("nodeRegistration.{s}");
    if !n.name.is_empty() {
        check(
            report,
            &f("name"),
            validate::is_dns1123_subdomain(&n.name),
            format!(
                "{:?} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')",
                n.name
            ),
        );
    }
    if !n.cri_socket.is_empty() {
        check(
            report,
            &f("criSocket"),
            n.cri_socket
                .strip_prefix("unix://")
                .is_some_and(|p| p.starts_with('/')),
            format!(
                "{:?} is not a unix:// URL of an absolute socket path",
                n.cri_socket
            ),
        );
    }
    for (i, t) in n.taints.iter().flatten().enumerate() {
        check(
            report,
            &f(&format!("taints[{i}].key")),
            validate::is_qualified_name(&t.key),
            format!("{:?} is not a qualified name", t.key),
        );
        check(
            report,
            &f(&format!("taints[{i}].effect")),
            matches!(
                t.effect.as_str(),
                "NoSchedule" | "PreferNoSchedule" | "NoExecute"
            ),
            format!(
                "{:?}: must be NoSchedule, PreferNoSchedule or NoExecute",
                t.effect
            ),
        );
    }
    check_args(report, &f("kubeletExtraArgs"), &n.kubelet_extra_args);
    check(
        report,
        &f("imagePullPolicy"),
        matches!(
            n.image_pull_policy.as_str(),
            "" | "Always" | "IfNotPresent" | "Never"
        ),
        format!(
            "{:?}: must be Always, IfNotPresent or Never",
            n.image_pull_policy
        ),
    );
}

pub(super) fn validate_init(c: &InitConfiguration, report: &mut Report<'_>) {
    for (i, t) in c.bootstrap_tokens.iter().enumerate() {
        let f = |s: &str| format!("bootstrapTokens[{i}].{s}");
        check(
            report,
            &f("token"),
            validate::is_bootstrap_token(&t.token),
            "required, and must match [a-z0-9]{6}.[a-z0-9]{16}",
        );
        check_duration(report, &f("ttl"), t.ttl.as_ref());
        for (j, u) in t.usages.iter().enumerate() {
            check(
                report,
                &f(&format!("usages[{j}]")),
                matches!(u.as_str(), "signing" | "authentication"),
                format!("{u:?}: must be signing or authentication"),
            );
        }
        for (j, g) in t.groups.iter().enumerate() {
            check(
                report,
                &f(&format!("groups[{j}]")),
                validate::is_bootstrap_group(g),
                format!("{g:?} does not match system:bootstrappers:[a-z0-9:-]{{0,255}}[a-z0-9]"),
            );
        }
    }
    check_node_registration(report, &c.node_registration);
    check_api_endpoint(report, "localAPIEndpoint", &c.local_api_endpoint);
    if !c.certificate_key.is_empty() {
        check(
            report,
            "certificateKey",
            validate::is_certificate_key(&c.certificate_key),
            "must be 64 hex digits (a 32-byte AES key)",
        );
    }
    check_timeouts(report, c.timeouts.as_ref());
}

pub(super) fn validate_cluster(c: &ClusterConfiguration, report: &mut Report<'_>) {
    if !c.kubernetes_version.is_empty() {
        check(
            report,
            "kubernetesVersion",
            validate::is_kubernetes_version(&c.kubernetes_version),
            format!(
                "{:?} is not a version such as v1.33.0 (the stand-in resolves no labels like \"stable\")",
                c.kubernetes_version
            ),
        );
    }
    if !c.control_plane_endpoint.is_empty()
        && let Err(why) = validate::check_optional_port_endpoint(&c.control_plane_endpoint)
    {
        report(Some("controlPlaneEndpoint".into()), why);
    }
    for (field, value) in [
        ("networking.serviceSubnet", &c.networking.service_subnet),
        ("networking.podSubnet", &c.networking.pod_subnet),
    ] {
        if !value.is_empty()
            && let Err(why) = validate::check_subnets(value)
        {
            report(Some(field.into()), why);
        }
    }
    if !c.networking.dns_domain.is_empty() {
        check(
            report,
            "networking.dnsDomain",
            validate::is_dns1123_subdomain(&c.networking.dns_domain),
            format!("{:?} is not a DNS-1123 subdomain", c.networking.dns_domain),
        );
    }
    match (&c.etcd.local, &c.etcd.external) {
        (Some(_), Some(_)) => report(
            Some("etcd".into()),
            "local and external are mutually exclusive".into(),
        ),
        (Some(local), None) => {
            check_args(report, "etcd.local.extraArgs", &local.extra_args);
            check_envs(report, "etcd.local.extraEnvs", &local.extra_envs);
        }
        (None, Some(external)) => {
            check(
                report,
                "etcd.external.endpoints",
                !external.endpoints.is_empty(),
                "required: at least one etcd endpoint",
            );
            for (i, e) in external.endpoints.iter().enumerate() {
                check(
                    report,
                    &format!("etcd.external.endpoints[{i}]"),
                    e.starts_with("https://") || e.starts_with("http://"),
                    format!("{e:?} is not an http(s) URL"),
                );
            }
        }
        (None, None) => {}
    }
    for (field, component) in [
        ("controllerManager", &c.controller_manager),
        ("scheduler", &c.scheduler),
    ] {
        check_args(report, &format!("{field}.extraArgs"), &component.extra_args);
        check_volumes(
            report,
            &format!("{field}.extraVolumes"),
            &component.extra_volumes,
        );
        check_envs(report, &format!("{field}.extraEnvs"), &component.extra_envs);
    }
    check_args(report, "apiServer.extraArgs", &c.api_server.extra_args);
    check_volumes(
        report,
        "apiServer.extraVolumes",
        &c.api_server.extra_volumes,
    );
    check_envs(report, "apiServer.extraEnvs", &c.api_server.extra_envs);
    for (i, san) in c.api_server.cert_sans.iter().enumerate() {
        let name = san.strip_prefix("*.").unwrap_or(san);
        check(
            report,
            &format!("apiServer.certSANs[{i}]"),
            validate::is_host(name),
            format!("{san:?} is neither an IP address nor a DNS name"),
        );
    }
    if !c.certificates_dir.is_empty() {
        check(
            report,
            "certificatesDir",
            c.certificates_dir.starts_with('/'),
            "must be an absolute path",
        );
    }
    check(
        report,
        "encryptionAlgorithm",
        matches!(
            c.encryption_algorithm.as_str(),
            "" | "RSA-2048" | "RSA-3072" | "RSA-4096" | "ECDSA-P256"
        ),
        format!(
            "{:?}: must be RSA-2048, RSA-3072, RSA-4096 or ECDSA-P256",
            c.encryption_algorithm
        ),
    );
    check_duration(
        report,
        "certificateValidityPeriod",
        c.certificate_validity_period.as_ref(),
    );
    check_duration(
        report,
        "caCertificateValidityPeriod",
        c.ca_certificate_validity_period.as_ref(),
    );
}

pub(super) fn validate_join(c: &JoinConfiguration, report: &mut Report<'_>) {
    check_node_registration(report, &c.node_registration);
    if !c.ca_cert_path.is_empty() {
        check(
            report,
            "caCertPath",
            c.ca_cert_path.starts_with('/'),
            "must be an absolute path",
        );
    }
    match (&c.discovery.bootstrap_token, &c.discovery.file) {
        (Some(_), Some(_)) => report(
            Some("discovery".into()),
            "bootstrapToken and file are mutually exclusive".into(),
        ),
        (None, Some(_)) => report(
            Some("discovery.file".into()),
            "the stand-in implements bootstrap-token discovery only (what hawser uses)".into(),
        ),
        (None, None) => report(
            Some("discovery.bootstrapToken".into()),
            "required: bootstrapToken or file discovery must be set".into(),
        ),
        (Some(b), None) => {
            check(
                report,
                "discovery.bootstrapToken.token",
                validate::is_bootstrap_token(&b.token),
                "required, and must match [a-z0-9]{6}.[a-z0-9]{16}",
            );
            if b.api_server_endpoint.is_empty() {
                report(
                    Some("discovery.bootstrapToken.apiServerEndpoint".into()),
                    "required: the API server's host:port".into(),
                );
            } else if let Err(why) = validate::split_host_port(&b.api_server_endpoint) {
                report(
                    Some("discovery.bootstrapToken.apiServerEndpoint".into()),
                    why,
                );
            }
            for (i, h) in b.ca_cert_hashes.iter().enumerate() {
                check(
                    report,
                    &format!("discovery.bootstrapToken.caCertHashes[{i}]"),
                    validate::is_ca_cert_hash(h),
                    format!("{h:?} is not sha256:<64 hex digits>"),
                );
            }
            if b.ca_cert_hashes.is_empty() && !b.unsafe_skip_ca_verification {
                report(
                    Some("discovery.bootstrapToken".into()),
                    "token-based discovery without caCertHashes can be unsafe: set \
                     caCertHashes, or unsafeSkipCAVerification: true to continue"
                        .into(),
                );
            }
        }
    }
    if !c.discovery.tls_bootstrap_token.is_empty() {
        check(
            report,
            "discovery.tlsBootstrapToken",
            validate::is_bootstrap_token(&c.discovery.tls_bootstrap_token),
            "must match [a-z0-9]{6}.[a-z0-9]{16}",
        );
    }
    if let Some(cp) = &c.control_plane {
        check_api_endpoint(
            report,
            "controlPlane.localAPIEndpoint",
            &cp.local_api_endpoint,
        );
        if !cp.certificate_key.is_empty() {
            check(
                report,
                "controlPlane.certificateKey",
                validate::is_certificate_key(&cp.certificate_key),
                "must be 64 hex digits (a 32-byte AES key)",
            );
        }
    }
    check_timeouts(report, c.timeouts.as_ref());
}
