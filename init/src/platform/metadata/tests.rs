use std::time::Instant;

use hawser_harness::metadata_server::{Impersonation, MetadataFlavor, MetadataServer};

use super::*;

fn value(keys: &HawserKeys, key: &str) -> String {
    String::from_utf8(keys[key].clone()).unwrap()
}

/// A `recursive=true` answer as Google documents it (attribute name → string), with attributes
/// of other software beside hawser's.
const GCE_ATTRIBUTES: &str = r##"{
  "enable-oslogin": "TRUE",
  "hawser-join-endpoint": "10.128.0.2:9000",
  "hawser-role": "worker",
  "hawser-quote_nonce": "00112233",
  "ssh-keys": "admin:ssh-ed25519 AAAAC3Nza admin",
  "startup-script": "#! /bin/bash\necho hi"
}"##;

#[test]
fn gce_attributes_named_hawser_are_the_keys_with_dashes_read_as_underscores() {
    let keys = parse_gce_attributes(GCE_ATTRIBUTES.as_bytes()).unwrap();
    assert_eq!(keys.names(), ["join_endpoint", "quote_nonce", "role"]);
    assert_eq!(value(&keys, "join_endpoint"), "10.128.0.2:9000");
    assert_eq!(value(&keys, "role"), "worker");
    assert!(parse_gce_attributes(b"{}").unwrap().is_empty());
}

#[test]
fn gce_attributes_that_cannot_be_hawser_keys_are_refused_without_their_values() {
    let both = br#"{"hawser-join-endpoint":"a:1","hawser-join_endpoint":"b:2"}"#;
    let error = parse_gce_attributes(both).unwrap_err().to_string();
    assert!(
        error.contains("join_endpoint") && error.contains("already given"),
        "{error}"
    );
    assert!(!error.contains("a:1") && !error.contains("b:2"), "{error}");

    let not_a_string = br#"{"hawser-state_disk_key":["0123456789abcdef"]}"#;
    let error = parse_gce_attributes(not_a_string).unwrap_err().to_string();
    assert!(!error.contains("0123456789abcdef"), "{error}");
    assert!(error.contains("not a JSON object of strings"), "{error}");

    for bad in [
        &br#"{"hawser-":"x"}"#[..],
        br#"{"hawser-a.b":"x"}"#,
        b"[1]",
        b"not json",
    ] {
        assert!(
            parse_gce_attributes(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    let long = format!(r#"{{"hawser-role":"{}"}}"#, "w".repeat(MAX_VALUE_BYTES + 1));
    let error = parse_gce_attributes(long.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(error.contains("more than the 4096 accepted"), "{error}");
    // Only hawser's values are bounded: other software's may be long.
    let other = format!(r#"{{"startup-script":"{}"}}"#, "x".repeat(100_000));
    assert!(parse_gce_attributes(other.as_bytes()).unwrap().is_empty());
}

#[test]
fn user_data_is_key_value_lines_with_comments() {
    let text = b"# hawser keys\r\nrole = worker\r\n\njoin-endpoint=10.0.0.2:9000,10.0.0.3:9000\n  \
                 quote_nonce=00112233  \nlan_net=a=b\n";
    let keys = parse_user_data(text).unwrap();
    assert_eq!(
        keys.names(),
        ["join_endpoint", "lan_net", "quote_nonce", "role"]
    );
    assert_eq!(value(&keys, "role"), "worker");
    assert_eq!(value(&keys, "join_endpoint"), "10.0.0.2:9000,10.0.0.3:9000");
    assert_eq!(value(&keys, "quote_nonce"), "00112233");
    assert_eq!(value(&keys, "lan_net"), "a=b");
    assert!(parse_user_data(b"").unwrap().is_empty());
    assert!(parse_user_data("\u{feff}role=worker".as_bytes()).is_ok());
}

#[test]
fn malformed_user_data_names_the_line_not_its_content() {
    let secret = "00112233445566778899aabbccddeeff";
    let error = parse_user_data(format!("role=worker\n{secret}\n").as_bytes())
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "user data line 2 is not `key=value` (nor empty, nor a `#` comment)"
    );
    let error =
        parse_user_data(format!("state_disk_key={secret}\nstate-disk-key={secret}").as_bytes())
            .unwrap_err()
            .to_string();
    assert!(
        error.contains("line 2") && !error.contains(secret),
        "{error}"
    );
    assert!(parse_user_data(b"=x").is_err());
    assert!(parse_user_data(b"ro le=x").is_err());
    assert!(parse_user_data(b"role=\xff").is_err());
}

#[test]
fn azure_user_data_is_base64_of_the_same_lines() {
    // base64 of "role=worker\njoin_endpoint=10.0.0.2:9000\n".
    let keys = parse_azure_user_data(b"cm9sZT13b3JrZXIKam9pbl9lbmRwb2ludD0xMC4wLjAuMjo5MDAwCg==\n")
        .unwrap();
    assert_eq!(keys.names(), ["join_endpoint", "role"]);
    assert!(parse_azure_user_data(b"").unwrap().is_empty());
    assert!(parse_azure_user_data(b"not base64!").is_err());
    // Azure's documentation example, "sample userData": user data, but not hawser's format.
    let error = parse_azure_user_data(b"c2FtcGxlIHVzZXJEYXRh")
        .unwrap_err()
        .to_string();
    assert!(error.contains("line 1 is not `key=value`"), "{error}");
}

#[test]
fn aws_tokens_are_one_visible_word() {
    assert_eq!(
        parse_aws_token(b"AQAEAFbT0ken==\n").unwrap().as_str(),
        "AQAEAFbT0ken=="
    );
    assert!(parse_aws_token(b"").is_err());
    assert!(parse_aws_token(b"two words").is_err());
}

#[test]
fn keys_show_their_names_only_and_feed_the_fw_cfg_allow_list() {
    let keys = HawserKeys::from([
        ("state_disk_key", "00112233445566778899aabbccddeeff"),
        ("init_secret_hash", "ab"),
        ("role", "control-plane"),
    ]);
    let shown = format!("{keys:?}");
    assert_eq!(shown, r#"{"init_secret_hash", "role", "state_disk_key"}"#);
    // The same allow-list as fw_cfg: init_secret_hash is refused, role is taken.
    let config = crate::config::parse_fw_cfg(&keys).unwrap();
    assert!(config.control_plane);
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("init_secret_hash")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn base_urls_are_http_and_an_ipv4_address() {
    let base: BaseUrl = "http://127.0.0.1:8080/".parse().unwrap();
    assert_eq!(base.address(), "127.0.0.1:8080".parse().unwrap());
    assert_eq!(base.to_string(), "http://127.0.0.1:8080");
    assert_eq!(BaseUrl::default().to_string(), "http://169.254.169.254");
    assert_eq!(
        "http://169.254.169.254".parse::<BaseUrl>().unwrap(),
        BaseUrl::default()
    );
    for bad in [
        "https://169.254.169.254",
        "http://metadata.google.internal",
        "169.254.169.254",
    ] {
        assert!(bad.parse::<BaseUrl>().is_err(), "{bad}");
    }
    assert_eq!(MetadataSource::parse("gce"), Some(MetadataSource::Gce));
    assert_eq!(MetadataSource::parse("GCE"), None);
}

fn base(server: &MetadataServer) -> BaseUrl {
    server.base_url().parse().unwrap()
}

#[tokio::test]
async fn gce_keys_are_read_with_the_flavor_header_after_transient_failures() {
    let server = MetadataServer::gce([
        ("hawser-role", "worker"),
        ("hawser-state_disk_key", "00112233445566778899aabbccddeeff"),
        ("ssh-keys", "admin:ssh-ed25519 AAAA"),
    ])
    .unwrap();
    server.fail_next(&[503, 429]);
    let keys = read_hawser_keys_from(MetadataSource::Gce, base(&server), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(keys.names(), ["role", "state_disk_key"]);
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        assert_eq!(
            request.target,
            "/computeMetadata/v1/instance/attributes/?recursive=true"
        );
        assert_eq!(request.header("metadata-flavor"), Some("Google"));
        assert_eq!(request.header("x-forwarded-for"), None);
    }
}

#[tokio::test]
async fn a_server_that_is_not_googles_is_refused_at_once() {
    let server = MetadataServer::gce([("hawser-role", "worker")]).unwrap();
    server.impersonate(Impersonation::NotGoogle);
    let error = read_hawser_keys_from(MetadataSource::Gce, base(&server), Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(error, MetadataError::NotGoogle { .. }), "{error}");
    assert!(
        error.to_string().contains("Metadata-Flavor: Google"),
        "{error}"
    );
    assert_eq!(server.requests().len(), 1);

    // 403 will not change by asking again either.
    server.impersonate(Impersonation::Faithful);
    server.fail_next(&[403]);
    let error = read_hawser_keys_from(MetadataSource::Gce, base(&server), Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(error, MetadataError::Status { status: 403, .. }),
        "{error}"
    );
}

#[tokio::test]
async fn no_metadata_service_is_an_error_at_the_deadline_naming_the_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base: BaseUrl = format!("http://127.0.0.1:{port}").parse().unwrap();
    let started = Instant::now();
    let error = read_hawser_keys_from(MetadataSource::Gce, base, Duration::from_millis(700))
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(700) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "GCE metadata at http://127.0.0.1:{port}/computeMetadata/v1/instance/attributes/\
             ?recursive=true: no answer within 0.7 s (last: connect: "
        )),
        "{text}"
    );
}

#[tokio::test]
async fn answers_larger_than_the_bound_are_refused() {
    let server = MetadataServer::gce([("startup-script", "x".repeat(MAX_RESPONSE_BYTES))]).unwrap();
    let error = read_hawser_keys_from(MetadataSource::Gce, base(&server), Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(error, MetadataError::TooLarge { .. }), "{error}");
}

#[tokio::test]
async fn azure_user_data_is_read_with_the_metadata_header() {
    let server = MetadataServer::start(MetadataFlavor::Azure {
        user_data: b"role=worker\nvpn_endpoint=10.0.0.2:51820\n".to_vec(),
    })
    .unwrap();
    let keys = read_hawser_keys_from(
        MetadataSource::Azure,
        base(&server),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(keys.names(), ["role", "vpn_endpoint"]);
    assert_eq!(server.requests()[0].header("metadata"), Some("true"));

    server.set_flavor(MetadataFlavor::Azure {
        user_data: b"#!/bin/sh\necho not hawser's\n".to_vec(),
    });
    let error = read_hawser_keys_from(
        MetadataSource::Azure,
        base(&server),
        Duration::from_secs(10),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with(&format!(
            "Azure metadata at {}/metadata/instance/compute/userData?api-version=2021-01-01\
             &format=text: user data line 2 is not `key=value`",
            server.base_url()
        )),
        "{error}"
    );
    assert!(
        error.ends_with("fix it: set the VM's user data to key=value lines"),
        "{error}"
    );
}

#[tokio::test]
async fn aws_user_data_is_read_with_an_imdsv2_token() {
    let server = MetadataServer::start(MetadataFlavor::Aws {
        user_data: Some(b"role=control-plane\n".to_vec()),
    })
    .unwrap();
    server.fail_next(&[500]);
    let keys = read_hawser_keys_from(MetadataSource::Aws, base(&server), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(value(&keys, "role"), "control-plane");
    let requests = server.requests();
    let put = &requests[1];
    assert_eq!((put.method.as_str(), put.status), ("PUT", 200));
    assert_eq!(
        put.header("x-aws-ec2-metadata-token-ttl-seconds"),
        Some(AWS_TOKEN_TTL_SECONDS)
    );
    let get = &requests[2];
    assert_eq!(
        (get.target.as_str(), get.status),
        ("/latest/user-data", 200)
    );
    assert!(get.header("x-aws-ec2-metadata-token").is_some());

    // No user data: no keys.
    server.set_flavor(MetadataFlavor::Aws { user_data: None });
    let keys = read_hawser_keys_from(MetadataSource::Aws, base(&server), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(keys.is_empty());
}

/// A file of platforms/tests/vectors/ (see its README for where each comes from).
fn vector(path: &str) -> Vec<u8> {
    let path = format!(
        "{}/../platforms/tests/vectors/{path}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The single-line `key: >-` scalar of flashbots' Azure TDX capture, decoded (base64url).
fn azure_tdx_capture(key: &str) -> Vec<u8> {
    use base64::Engine as _;
    let yaml = vector("azure/azure-tdx-with-ak-intermediates-1780922561.yaml");
    let yaml = String::from_utf8(yaml).unwrap();
    let mut lines = yaml.lines();
    lines.find(|line| *line == format!("{key}: >-")).unwrap();
    let value = lines.next().unwrap().trim();
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .unwrap()
}

fn azure_server() -> MetadataServer {
    MetadataServer::start(MetadataFlavor::Azure {
        user_data: Vec::new(),
    })
    .unwrap()
}

#[tokio::test]
async fn azure_vcek_chain_is_thims_pem_read_with_the_metadata_header_after_503() {
    use hawser_harness::metadata_server::{AzureCvm, ThimCertification};
    let vcek = String::from_utf8(vector("azure/vcek-genoa.pem")).unwrap();
    let chain = String::from_utf8(vector("sev-snp/go-sev-guest/ask_ark_genoa.pem")).unwrap();
    let server = azure_server();
    server.set_azure_cvm(AzureCvm {
        thim: Some(ThimCertification {
            vcek_cert: vcek.clone(),
            certificate_chain: chain.clone(),
            tcbm: "DB18000000000004".to_owned(),
        }),
        td_quote: None,
    });
    server.fail_next(&[503, 429]);
    let pem = azure_vcek_chain(base(&server), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(pem).unwrap(),
        format!("{}\n{}\n", vcek.trim_end(), chain.trim_end())
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        assert_eq!(
            (request.method.as_str(), request.target.as_str()),
            ("GET", THIM_PATH)
        );
        assert_eq!(request.header("metadata"), Some("true"));
    }

    // An answer without certificates is refused at once, naming the field.
    server.set_azure_cvm(AzureCvm {
        thim: Some(ThimCertification {
            vcek_cert: "not PEM".to_owned(),
            certificate_chain: chain,
            tcbm: String::new(),
        }),
        td_quote: None,
    });
    let error = azure_vcek_chain(base(&server), Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(error, MetadataError::BadAnswer { .. }), "{error}");
    assert!(error.to_string().contains("vcekCert"), "{error}");
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn azure_td_quote_sends_the_tdreport_in_base64url_and_decodes_the_quote() {
    use base64::Engine as _;
    use hawser_harness::metadata_server::AzureCvm;
    // A real Azure TDX CVM's HCL report and the quote Azure gave for its TDREPORT.
    let hcl_report = azure_tdx_capture("hcl_report_base64");
    let td_report = &hcl_report[32..32 + 1024];
    let captured_quote = azure_tdx_capture("tdx_quote_base64");
    let server = azure_server();
    server.set_azure_cvm(AzureCvm {
        thim: None,
        td_quote: Some(captured_quote.clone()),
    });
    server.fail_next(&[500]);
    let quote = azure_td_quote(base(&server), td_report, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(quote, captured_quote);
    let requests = server.requests();
    assert_eq!(
        requests.iter().map(|r| r.status).collect::<Vec<_>>(),
        [500, 200]
    );
    let post = &requests[1];
    assert_eq!(
        (post.method.as_str(), post.target.as_str()),
        ("POST", TD_QUOTE_PATH)
    );
    assert_eq!(post.header("metadata"), Some("true"));
    assert_eq!(post.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_slice(&post.body).unwrap();
    let sent = body["report"].as_str().unwrap();
    assert!(!sent.contains('=') && !sent.contains('+') && !sent.contains('/'));
    assert_eq!(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(sent)
            .unwrap(),
        td_report
    );
}

#[tokio::test]
async fn azure_attestation_reads_on_a_vm_without_the_service_fail_at_once_naming_the_vm() {
    let server = azure_server();
    let error = azure_vcek_chain(base(&server), Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(error, MetadataError::Status { status: 404, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("SEV-SNP confidential VMs only"),
        "{error}"
    );
    let error = azure_td_quote(base(&server), &[0; 1024], Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("TDX confidential VMs only"),
        "{error}"
    );
    // A malformed TDREPORT is refused by the service (400): final too.
    server.set_azure_cvm(hawser_harness::metadata_server::AzureCvm {
        thim: None,
        td_quote: Some(vec![1, 2, 3]),
    });
    let error = azure_td_quote(base(&server), &[0; 10], Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(error, MetadataError::Status { status: 400, .. }),
        "{error}"
    );
    assert_eq!(server.requests().len(), 3);
}

#[test]
fn a_td_quote_answer_is_read_with_or_without_padding_and_nothing_else() {
    use super::azure_cvm::parse_td_quote;
    let quote = [0xfbu8, 0xef, 0xbe, 0xde];
    for text in ["----3g", "----3g==", "++++3g=="] {
        let json = format!(r#"{{"quote":"{text}"}}"#);
        assert_eq!(parse_td_quote(json.as_bytes()).unwrap(), quote, "{text}");
    }
    for (bad, why) in [
        (&br#"{"quote":""}"#[..], "empty"),
        (br#"{"quote":"%%%"}"#, "not base64url"),
        (br#"{"quote":1}"#, "no string"),
        (b"quote", "not JSON"),
    ] {
        let error = parse_td_quote(bad).unwrap_err();
        assert!(error.contains(why), "{error}");
    }
}
