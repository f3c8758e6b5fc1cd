use std::io::{Read as _, Write as _};

use super::*;

/// Sends `requests` on one connection (as QEMU's guestfwd chardev carries every guest
/// connection on one), reading each answer by its Content-Length; returns (status, headers,
/// body) per request.
fn exchange(server: &MetadataServer, requests: &[String]) -> Vec<(u16, String, Vec<u8>)> {
    let mut stream = TcpStream::connect(server.address()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answers = Vec::new();
    let mut buffer = Vec::new();
    for request in requests {
        stream.write_all(request.as_bytes()).unwrap();
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).unwrap();
            assert_ne!(n, 0, "the server closed the connection");
            buffer.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8(buffer[..head_end].to_vec()).unwrap();
        buffer.drain(..head_end + 4);
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        while buffer.len() < length {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).unwrap();
            assert_ne!(n, 0, "the server closed the connection mid-answer");
            buffer.extend_from_slice(&chunk[..n]);
        }
        let body: Vec<u8> = buffer.drain(..length).collect();
        answers.push((status, head, body));
    }
    answers
}

fn get(target: &str, headers: &str) -> String {
    format!("GET {target} HTTP/1.1\r\nHost: 169.254.169.254\r\n{headers}Connection: close\r\n\r\n")
}

const ATTRIBUTES: &str = "/computeMetadata/v1/instance/attributes/";

#[test]
fn gce_answers_google_clients_only_and_keeps_the_connection_open() {
    let server = MetadataServer::gce([
        ("hawser-role", "worker"),
        ("hawser-join_endpoint", "10.0.0.2:9000"),
        ("ssh-keys", "admin:ssh-ed25519 AAAA"),
    ])
    .unwrap();
    let flavor = "Metadata-Flavor: Google\r\n";
    let answers = exchange(
        &server,
        &[
            get(&format!("{ATTRIBUTES}?recursive=true"), flavor),
            get(&format!("{ATTRIBUTES}?recursive=true"), ""),
            get(
                &format!("{ATTRIBUTES}hawser-role"),
                "Metadata-Flavor: Google\r\nX-Forwarded-For: 10.0.0.9\r\n",
            ),
            get(&format!("{ATTRIBUTES}hawser-role"), flavor),
            get(ATTRIBUTES, flavor),
            get(&format!("{ATTRIBUTES}absent"), flavor),
        ],
    );
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [200, 403, 403, 200, 200, 404]);
    for (_, head, _) in &answers {
        assert!(head.contains("\r\nMetadata-Flavor: Google"), "{head}");
    }
    let json: BTreeMap<String, String> = serde_json::from_slice(&answers[0].2).unwrap();
    assert_eq!(json["hawser-join_endpoint"], "10.0.0.2:9000");
    assert_eq!(json.len(), 3);
    assert_eq!(answers[3].2, b"worker");
    assert_eq!(
        answers[4].2,
        b"hawser-join_endpoint\nhawser-role\nssh-keys\n"
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 6);
    assert_eq!(requests[0].header("metadata-flavor"), Some("Google"));
    assert_eq!(requests[1].status, 403);
}

#[test]
fn queued_failures_come_first_and_a_non_google_server_lacks_the_header() {
    let server = MetadataServer::gce([("hawser-role", "worker")]).unwrap();
    server.fail_next(&[503, 500]);
    let request = get(
        &format!("{ATTRIBUTES}hawser-role"),
        "Metadata-Flavor: Google\r\n",
    );
    let answers = exchange(
        &server,
        &[request.clone(), request.clone(), request.clone()],
    );
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [503, 500, 200]);

    server.impersonate(Impersonation::NotGoogle);
    let answers = exchange(&server, &[request]);
    assert_eq!(answers[0].0, 200);
    assert!(
        !answers[0].1.contains("Metadata-Flavor"),
        "{}",
        answers[0].1
    );
}

#[test]
fn azure_serves_user_data_in_base64_with_the_metadata_header() {
    let server = MetadataServer::start(MetadataFlavor::Azure {
        user_data: b"role=worker\n".to_vec(),
    })
    .unwrap();
    let path = "/metadata/instance/compute/userData?api-version=2021-01-01&format=text";
    let answers = exchange(&server, &[get(path, "Metadata: true\r\n"), get(path, "")]);
    assert_eq!(answers[0].0, 200);
    assert_eq!(answers[0].2, b"cm9sZT13b3JrZXIK");
    assert_eq!(answers[1].0, 400);
}

fn post(target: &str, headers: &str, body: &str) -> String {
    format!(
        "POST {target} HTTP/1.1\r\nHost: 169.254.169.254\r\n{headers}Content-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn azure_serves_a_confidential_vms_vcek_chain_and_td_quote_with_the_metadata_header() {
    let server = MetadataServer::start(MetadataFlavor::Azure {
        user_data: Vec::new(),
    })
    .unwrap();
    let header = "Metadata: true\r\n";
    // Not a confidential VM: neither endpoint.
    let report = [7u8; TD_REPORT_LEN];
    let unpadded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(report);
    let body = format!(r#"{{"report":"{unpadded}"}}"#);
    let answers = exchange(
        &server,
        &[get(THIM_PATH, header), post(TD_QUOTE_PATH, header, &body)],
    );
    assert_eq!((answers[0].0, answers[1].0), (404, 404));

    server.set_azure_cvm(AzureCvm {
        thim: Some(ThimCertification {
            vcek_cert: "-----BEGIN CERTIFICATE-----\nVCEK\n-----END CERTIFICATE-----\n".into(),
            certificate_chain: "-----BEGIN CERTIFICATE-----\nASK\n-----END CERTIFICATE-----\n"
                .into(),
            tcbm: "DB18000000000004".into(),
        }),
        td_quote: Some(vec![0xfb; 100]),
    });
    let padded = base64::engine::general_purpose::URL_SAFE.encode(report);
    assert!(padded.ends_with("=="));
    let answers = exchange(
        &server,
        &[
            get(THIM_PATH, header),
            get(THIM_PATH, ""),
            post(TD_QUOTE_PATH, header, &body),
            post(
                TD_QUOTE_PATH,
                header,
                &format!(r#"{{"report":"{padded}"}}"#),
            ),
            post(TD_QUOTE_PATH, "", &body),
            post(TD_QUOTE_PATH, header, r#"{"report":"AAAA"}"#),
            get(TD_QUOTE_PATH, header),
        ],
    );
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [200, 400, 200, 200, 400, 400, 405]);
    let thim: serde_json::Value = serde_json::from_slice(&answers[0].2).unwrap();
    assert!(thim["vcekCert"].as_str().unwrap().contains("VCEK"));
    assert!(thim["certificateChain"].as_str().unwrap().contains("ASK"));
    assert_eq!(thim["tcbm"], "DB18000000000004");
    let quote: serde_json::Value = serde_json::from_slice(&answers[2].2).unwrap();
    // 100 bytes of 0xfb: URL-safe characters only, no padding.
    let quote = quote["quote"].as_str().unwrap();
    assert!(quote.starts_with("-_v7") && !quote.contains('='), "{quote}");
    assert_eq!(answers[3].2, answers[2].2);
    assert_eq!(server.requests()[4].body, body.as_bytes());
}

#[test]
fn aws_serves_user_data_to_holders_of_a_token() {
    let server = MetadataServer::start(MetadataFlavor::Aws {
        user_data: Some(b"role=worker\n".to_vec()),
    })
    .unwrap();
    let put = |ttl: &str| {
        format!(
            "PUT /latest/api/token HTTP/1.1\r\nHost: 169.254.169.254\r\n\
             X-aws-ec2-metadata-token-ttl-seconds: {ttl}\r\nContent-Length: 0\r\n\r\n"
        )
    };
    let answers = exchange(&server, &[put("21600"), put("0")]);
    assert_eq!((answers[0].0, answers[1].0), (200, 400));
    let token = String::from_utf8(answers[0].2.clone()).unwrap();
    let answers = exchange(
        &server,
        &[
            get(
                "/latest/user-data",
                &format!("X-aws-ec2-metadata-token: {token}\r\n"),
            ),
            get("/latest/user-data", "X-aws-ec2-metadata-token: forged\r\n"),
        ],
    );
    assert_eq!((answers[0].0, answers[1].0), (200, 401));
    assert_eq!(answers[0].2, b"role=worker\n");

    server.set_flavor(MetadataFlavor::Aws { user_data: None });
    let answers = exchange(
        &server,
        &[get(
            "/latest/user-data",
            &format!("X-aws-ec2-metadata-token: {token}\r\n"),
        )],
    );
    assert_eq!(answers[0].0, 404);
}

#[test]
fn the_user_netdev_forwards_the_metadata_address_inside_a_restricted_network() {
    assert_eq!(
        gce_user_netdev("net0", 40123),
        "user,id=net0,net=169.254.169.0/24,host=169.254.169.2,dhcpstart=169.254.169.15,\
         restrict=on,guestfwd=tcp:169.254.169.254:80-tcp:127.0.0.1:40123"
    );
}

#[test]
fn dropping_the_server_stops_it_with_connections_open() {
    let server = MetadataServer::gce([("hawser-role", "worker")]).unwrap();
    let address = server.address();
    let idle = TcpStream::connect(address).unwrap();
    let started = std::time::Instant::now();
    drop(server);
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(idle);
    assert!(TcpStream::connect(address).is_err());
}
