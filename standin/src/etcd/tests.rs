//! Tests of the etcd member: the ports variable and kubeadm's command line.

use super::*;

#[test]
fn ports_parse_and_refuse_what_is_not_three_ports() {
    let map = parse_ports("127.0.0.2=1:2:3, ::1=4:5:6").unwrap();
    assert_eq!(
        map[&"127.0.0.2".parse::<IpAddr>().unwrap()],
        Ports {
            client: 1,
            peer: 2,
            metrics: 3
        }
    );
    assert_eq!(map[&"::1".parse::<IpAddr>().unwrap()].metrics, 6);
    for bad in [
        "127.0.0.2",
        "x=1:2:3",
        "127.0.0.2=1:2",
        "127.0.0.2=1:2:0",
        "127.0.0.2=1:2:3:4",
    ] {
        assert!(parse_ports(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_command_line_is_kubeadms() {
    let env = StandinEnv {
        root: PathBuf::from("/"),
        hostname: "cp-1".into(),
    };
    let member = LocalMember::new(
        &env,
        "cp-1",
        "localAPIEndpoint.advertiseAddress",
        "10.0.0.5",
        None,
    )
    .unwrap();
    let command = member.command("cp-1=https://10.0.0.5:2380", "new");
    assert_eq!(command[0], "etcd");
    for flag in [
        "--advertise-client-urls=https://10.0.0.5:2379",
        "--listen-client-urls=https://127.0.0.1:2379,https://10.0.0.5:2379",
        "--listen-peer-urls=https://10.0.0.5:2380",
        "--initial-advertise-peer-urls=https://10.0.0.5:2380",
        "--initial-cluster=cp-1=https://10.0.0.5:2380",
        "--initial-cluster-state=new",
        "--data-dir=/var/lib/etcd",
        "--client-cert-auth=true",
        "--peer-client-cert-auth=true",
        "--cert-file=/etc/kubernetes/pki/etcd/server.crt",
        "--trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt",
        "--listen-metrics-urls=http://127.0.0.1:2381",
        "--name=cp-1",
    ] {
        assert!(command.contains(&flag.to_owned()), "{flag} in {command:?}");
    }
    let v6 = LocalMember::new(&env, "cp-1", "f", "fd00::5", None).unwrap();
    assert!(
        v6.command("", "new")
            .contains(&"--listen-client-urls=https://[::1]:2379,https://[fd00::5]:2379".to_owned())
    );
    assert!(matches!(
        LocalMember::new(&env, "cp-1", "f", "", None),
        Err(EtcdError::Address { .. })
    ));
}
