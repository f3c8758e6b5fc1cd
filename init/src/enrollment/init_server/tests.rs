//! The init server's tests: each bad field named, secrets wiped from the request, the init secret
//! checked first, one grant at a time, and the server's stop once the node is locked.

use super::*;

const SECRET: [u8; 32] = [0x5e; 32];
/// A TPM name of a SHA-256 AK.
fn ak_name(byte: u8) -> Vec<u8> {
    let mut name = vec![0x00, 0x0b];
    name.extend_from_slice(&[byte; 32]);
    name
}

fn good_init() -> InitRequest {
    InitRequest {
        init_secret: SECRET.to_vec(),
        control_plane_approvals: vec![ak_name(0xa1)],
        master_secret: vec![7; 32],
        master_secret_salt: vec![8; 32],
        measurement_salt: vec![9; 32],
        cluster_name: "demo".into(),
        kubernetes_version: "v1.33.4".into(),
        service_cidr: "10.96.0.0/12".into(),
        api_server_cert_sans: vec!["10.0.2.15".into(), "api.example.com".into()],
        control_plane_endpoint: String::new(),
        vpn_prefix: "10.99.0.0/24".into(),
    }
}

#[test]
fn a_good_init_request_is_accepted_and_its_secrets_are_wiped_from_the_request() {
    let mut request = good_init();
    let (kind, _master, salt) = validate_init(&mut request, None).unwrap();
    assert_eq!(salt, vec![9; 32]);
    assert!(request.measurement_salt.is_empty());
    assert!(request.master_secret.iter().all(|&b| b == 0));
    let GrantKind::Init(spec) = kind else {
        panic!("not an init")
    };
    assert_eq!(spec.cluster_name, "demo");
    assert_eq!(spec.kubernetes_version.as_str(), "v1.33.4");
    assert_eq!(spec.api_server_cert_sans.len(), 2);
    assert_eq!(
        spec.control_plane_endpoint, None,
        "empty: the first node's address"
    );
    let mut with_endpoint = good_init();
    with_endpoint.control_plane_endpoint = "api.example:6443".into();
    let (GrantKind::Init(spec), _, _) = validate_init(&mut with_endpoint, None).unwrap() else {
        panic!("an Init request gives an Init grant");
    };
    assert_eq!(
        spec.control_plane_endpoint
            .map(|e| e.to_string())
            .as_deref(),
        Some("api.example:6443")
    );
    assert_eq!(
        spec.control_plane_approvals,
        vec![format!("000b{}", "a1".repeat(32))]
    );
    assert_eq!(
        spec.mesh_prefix.map(|p| p.to_string()).as_deref(),
        Some("10.99.0.0/24")
    );
    let mut without_mesh = good_init();
    without_mesh.vpn_prefix.clear();
    let (GrantKind::Init(spec), _, _) = validate_init(&mut without_mesh, None).unwrap() else {
        panic!("an Init request gives an Init grant");
    };
    assert_eq!(spec.mesh_prefix, None, "empty: no mesh");
}

#[test]
fn control_plane_approvals_must_be_tpm_names() {
    for bad in [
        vec![0x00, 0x0b, 1, 2],
        vec![0x00, 0x99, 1, 2, 3],
        Vec::new(),
    ] {
        let mut request = good_init();
        request.control_plane_approvals = vec![ak_name(1), bad];
        let err = validate_init(&mut request, None).unwrap_err();
        assert!(
            matches!(err, RequestError::ControlPlaneApproval { index: 1, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("is not an AK's TPM name"), "{err}");
    }
    let mut request = good_init();
    request.control_plane_approvals = vec![ak_name(1); MAX_CONTROL_PLANE_APPROVALS + 1];
    assert!(matches!(
        validate_init(&mut request, None),
        Err(RequestError::TooManyApprovals(65))
    ));
}

#[test]
fn each_bad_field_is_named() {
    type Mutation = fn(&mut InitRequest);
    let cases: [(Mutation, &str); 17] = [
        (
            |r| r.master_secret = vec![1; 8],
            "invalid master secret: the master secret is 8 bytes",
        ),
        (
            |r| r.measurement_salt = vec![1; 3],
            "measurement_salt must be 32 bytes, got 3",
        ),
        (|r| r.cluster_name = "Demo".into(), "cluster_name \"Demo\""),
        (|r| r.cluster_name = "-x".into(), "cluster_name \"-x\""),
        (
            |r| r.kubernetes_version = "1.33".into(),
            "kubernetes_version \"1.33\"",
        ),
        // kubeadm refuses leading zeros: refused here, before the node lock.
        (
            |r| r.kubernetes_version = "v1.033.0".into(),
            "kubernetes_version \"v1.033.0\" is not a Kubernetes version to install (e.g. \
             v1.33.4): not a Kubernetes version: the minor version has a leading zero",
        ),
        (
            |r| r.kubernetes_version = "v1.33".into(),
            "kubernetes_version \"v1.33\"",
        ),
        (
            |r| r.service_cidr = "10.96.0.0/33".into(),
            "service_cidr \"10.96.0.0/33\"",
        ),
        // Refused here, before the node lock, rather than by kubeadm after the pivot.
        (
            |r| r.service_cidr = "10.0.0.0/8".into(),
            "service_cidr \"10.0.0.0/8\" is not a usable Service range (e.g. 10.96.0.0/12): \
             too large",
        ),
        (
            |r| r.service_cidr = "10.96.0.1/12".into(),
            "host bits are set past the /12 prefix (the network is 10.96.0.0/12)",
        ),
        (
            |r| r.cluster_name = "demo.example".into(),
            "cluster_name \"demo.example\"",
        ),
        (
            |r| r.api_server_cert_sans.push("a b".into()),
            "entry \"a b\"",
        ),
        (
            |r| r.control_plane_endpoint = "api.example:99999".into(),
            "control_plane_endpoint \"api.example:99999\" is not host[:port]",
        ),
        (
            |r| r.vpn_prefix = "10.99.0.1/24".into(),
            "vpn_prefix \"10.99.0.1/24\" is not a usable WireGuard mesh prefix",
        ),
        (
            |r| r.vpn_prefix = "10.99.0.0".into(),
            "vpn_prefix \"10.99.0.0\"",
        ),
        (
            |r| r.vpn_prefix = "10.99.0.0/31".into(),
            "vpn_prefix \"10.99.0.0/31\"",
        ),
        (
            |r| r.vpn_prefix = "10.99.0.0/16".into(),
            "two nodes would get the same pod range",
        ),
    ];
    for (mutate, expected) in cases {
        let mut request = good_init();
        mutate(&mut request);
        let err = crate::platform::error_chain(&validate_init(&mut request, None).unwrap_err());
        assert!(err.contains(expected), "{err} should contain {expected}");
    }
}

#[test]
fn an_empty_version_is_the_images_and_another_one_is_refused_by_name() {
    let image: KubernetesVersion = "v1.20.2".parse().unwrap();
    let mut request = good_init();
    request.kubernetes_version = String::new();
    let (GrantKind::Init(spec), _, _) = validate_init(&mut request, Some(&image)).unwrap() else {
        panic!("an Init request gives an Init grant");
    };
    assert_eq!(spec.kubernetes_version, image);
    // The image's own version, spelled out, is the same request.
    let mut request = good_init();
    request.kubernetes_version = "v1.20.2".into();
    assert!(validate_init(&mut request, Some(&image)).is_ok());

    let mut request = good_init();
    let err = validate_init(&mut request, Some(&image)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "this image carries Kubernetes v1.20.2 (hawser.kubernetes on its command line); it \
         cannot install v1.33.4: omit --kubernetes-version or build an image of that version"
    );

    // An image without a rootfs names no version: the request must.
    let mut request = good_init();
    request.kubernetes_version = String::new();
    let err = validate_init(&mut request, None).unwrap_err();
    assert!(matches!(err, RequestError::NoImageVersion), "{err:?}");
    assert!(err.to_string().contains("--kubernetes-version"), "{err}");
}

#[test]
fn a_version_without_a_kubeadm_writer_is_refused_before_the_lock() {
    let mut request = good_init();
    request.kubernetes_version = "v1.25.0".into();
    let err = crate::platform::error_chain(&validate_init(&mut request, None).unwrap_err());
    assert_eq!(
        err,
        format!(
            "kubernetes_version v1.25.0 cannot be installed: hawser writes no kubeadm \
             configuration for Kubernetes v1.25.0: it writes for {}",
            hawser_kube_types::KUBEADM_WRITERS
        )
    );
}

#[test]
fn recover_needs_the_measurement_salt() {
    let mut request = RecoverRequest {
        init_secret: SECRET.to_vec(),
        master_secret: vec![7; 32],
        master_secret_salt: vec![8; 32],
        measurement_salt: Vec::new(),
    };
    let err = validate_recover(&mut request).unwrap_err();
    assert!(matches!(err, RequestError::MeasurementSalt(0)), "{err:?}");
}

fn server(disk: DiskStatus) -> (InitServer, mpsc::Receiver<Grant>, Arc<NodeLock>) {
    let lock = Arc::new(NodeLock::new());
    let (sender, receiver) = mpsc::channel(1);
    (
        InitServer::new(
            disk,
            Arc::clone(&lock),
            InitSecretHash::of(&SECRET),
            sender,
            Arc::new(Notify::new()),
        ),
        receiver,
        lock,
    )
}

fn good_recover() -> RecoverRequest {
    RecoverRequest {
        init_secret: SECRET.to_vec(),
        master_secret: vec![7; 32],
        master_secret_salt: vec![8; 32],
        measurement_salt: vec![9; 32],
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_without_the_right_init_secret_is_refused_first_and_changes_nothing() {
    let wrong = {
        let mut secret = SECRET.to_vec();
        secret[0] ^= 0x80;
        secret
    };
    let cases: [(Vec<u8>, &str); 3] = [
        (
            wrong,
            "init secret does not match the node's init secret hash",
        ),
        (Vec::new(), "the request carries none"),
        (SECRET[..31].to_vec(), "it is 31 bytes, expected 32"),
    ];
    let (s, mut grants, lock) = server(DiskStatus::New);
    for (secret, expected) in cases {
        // Even an otherwise invalid request is refused for its secret first.
        let mut request = good_init();
        request.init_secret = secret.clone();
        request.cluster_name = String::new();
        let status = s.init(Request::new(request)).await.err().unwrap();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status
                .message()
                .starts_with("init secret does not match the node's init secret hash"),
            "{}",
            status.message()
        );
        assert!(status.message().contains(expected), "{}", status.message());

        let mut request = good_recover();
        request.init_secret = secret;
        let (recovering, _, _) = server(DiskStatus::Initialized);
        let status = recovering
            .recover(Request::new(request))
            .await
            .err()
            .unwrap();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
    }
    assert!(grants.try_recv().is_err(), "a refused request gave a grant");
    assert!(matches!(lock.state(), State::Unlocked));
    // The right secret still wins afterwards.
    let _stream = s.init(Request::new(good_init())).await.unwrap();
    assert_eq!(grants.recv().await.unwrap().kind.rpc(), "Init");
}

#[tokio::test(start_paused = true)]
async fn the_server_is_told_to_stop_once_the_node_is_locked_and_the_admins_call_ended() {
    let lock = Arc::new(NodeLock::new());
    let (sender, mut grants) = mpsc::channel(1);
    let stop = Arc::new(Notify::new());
    let s = InitServer::new(
        DiskStatus::Initialized,
        Arc::clone(&lock),
        InitSecretHash::of(&SECRET),
        sender,
        Arc::clone(&stop),
    );
    // A refused grant ends its call without stopping the server.
    let refused = s.recover(Request::new(good_recover())).await.unwrap();
    grants.recv().await.unwrap().progress.fail("refused");
    drop(refused);
    let stopped = tokio::time::timeout(Duration::from_secs(1), stop.notified()).await;
    assert!(stopped.is_err(), "a refused grant stopped the server");

    let call = s.recover(Request::new(good_recover())).await.unwrap();
    let grant = grants.recv().await.unwrap();
    lock.lock(super::super::lock::Owner::InitServer, [3; 32], |_| {
        Ok::<(), std::io::Error>(())
    })
    .unwrap();
    grant.progress.succeed([3; 32], Vec::new());
    // Still open while the admin holds the call (its confirming quote) …
    let early = tokio::time::timeout(Duration::from_secs(1), stop.notified()).await;
    assert!(early.is_err(), "stopped while the admin's call was open");
    // … and told to stop once the admin hangs up.
    drop(call);
    tokio::time::timeout(Duration::from_secs(5), stop.notified())
        .await
        .expect("the server was not told to stop after the lock");
}

#[tokio::test]
async fn after_a_refused_grant_the_server_takes_the_next_request() {
    let (s, mut grants, lock) = server(DiskStatus::Initialized);
    let _first = s.recover(Request::new(good_recover())).await.unwrap();
    let busy = s.recover(Request::new(good_recover())).await.err().unwrap();
    assert!(
        busy.message().contains("already being served"),
        "{}",
        busy.message()
    );
    // The boot refuses the grant (its key did not open the disk).
    grants
        .recv()
        .await
        .unwrap()
        .progress
        .fail("Recover refused: the master secret does not give this node's state disk key");
    assert!(matches!(lock.state(), State::Unlocked));
    let _second = s.recover(Request::new(good_recover())).await.unwrap();
    assert_eq!(grants.recv().await.unwrap().kind.rpc(), "Recover");
}

#[tokio::test]
async fn an_init_for_another_version_than_the_images_gives_no_grant_and_leaves_the_node_as_it_was()
{
    let (s, mut grants, lock) = server(DiskStatus::New);
    let s = s.image_kubernetes(Some("v1.20.2".parse().unwrap()));
    let status = s.init(Request::new(good_init())).await.err().unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("this image carries Kubernetes v1.20.2 (hawser.kubernetes on its command line); it cannot install v1.33.4"),
        "{}",
        status.message()
    );
    // No grant: the race has no winner, so the disk is neither locked nor formatted.
    assert!(grants.try_recv().is_err(), "a refused request gave a grant");
    assert!(matches!(lock.state(), State::Unlocked));
    // The admin omits the version: the image's is installed.
    let mut request = good_init();
    request.kubernetes_version = String::new();
    let _stream = s.init(Request::new(request)).await.unwrap();
    let GrantKind::Init(spec) = grants.recv().await.unwrap().kind else {
        panic!("an Init request gives an Init grant");
    };
    assert_eq!(spec.kubernetes_version.as_str(), "v1.20.2");
}

#[tokio::test]
async fn init_on_an_initialized_disk_and_recover_on_a_new_disk_are_refused() {
    let (s, _rx, _) = server(DiskStatus::Initialized);
    let status = s.init(Request::new(good_init())).await.err().unwrap();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("never reformatted"),
        "{}",
        status.message()
    );

    let (s, _rx, _) = server(DiskStatus::New);
    let status = s.recover(Request::new(good_recover())).await.err().unwrap();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("use `hawser init`"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn the_first_valid_request_wins_and_streams_log_lines_then_the_outcome() {
    use tokio_stream::StreamExt as _;
    let (s, mut grants, _) = server(DiskStatus::New);
    let mut bad = good_init();
    bad.cluster_name = String::new();
    let status = s.init(Request::new(bad)).await.err().unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    let mut stream = s
        .init(Request::new(good_init()))
        .await
        .unwrap()
        .into_inner();
    let second = s.init(Request::new(good_init())).await.err().unwrap();
    assert!(
        second.message().contains("already being served"),
        "{}",
        second.message()
    );

    let grant = grants.recv().await.unwrap();
    assert_eq!(grant.kind.rpc(), "Init");
    crate::platform::console::emit(None, "formatting the state disk");
    // Give the forwarder a chance to pick the line up before the outcome.
    tokio::task::yield_now().await;
    grant.progress.succeed([5; 32], Vec::new());
    let mut lines = Vec::new();
    let mut outcome = None;
    // The call stays open after the outcome (for the admin's confirming quote): stop there.
    while let Some(item) = stream.next().await {
        match item.unwrap().kind.unwrap() {
            init_response::Kind::LogLine(line) => lines.push(line),
            other => {
                outcome = Some(other);
                break;
            }
        }
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("formatting the state disk")),
        "{lines:?}"
    );
    let Some(init_response::Kind::Success(success)) = outcome else {
        panic!("no success: {outcome:?}")
    };
    assert_eq!(success.cluster_id, vec![5; 32]);
}

#[tokio::test]
async fn a_locked_node_refuses_and_a_dropped_progress_reports_failure() {
    use tokio_stream::StreamExt as _;
    let (s, mut grants, lock) = server(DiskStatus::New);
    let mut stream = s
        .init(Request::new(good_init()))
        .await
        .unwrap()
        .into_inner();
    drop(grants.recv().await.unwrap());
    let last = loop {
        match stream.next().await {
            Some(item) => {
                if let Some(init_response::Kind::Failure(f)) = item.unwrap().kind {
                    break f.reason;
                }
            }
            None => panic!("stream ended without an outcome"),
        }
    };
    assert!(last.contains("stopped serving"), "{last}");

    lock.lock(super::super::lock::Owner::JoinClient, [1; 32], |_| {
        Ok::<(), std::io::Error>(())
    })
    .unwrap();
    let status = s.init(Request::new(good_init())).await.err().unwrap();
    assert!(
        status.message().contains("already belongs to cluster"),
        "{}",
        status.message()
    );
}
