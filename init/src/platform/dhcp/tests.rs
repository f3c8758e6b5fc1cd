use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable as _, Decoder, Encodable as _};

use super::*;

const MAC: [u8; 6] = [0x42, 0x01, 0x0a, 0x80, 0x00, 0x05];
const XID: u32 = 0x1234_5678;

fn ip(text: &str) -> Ipv4Addr {
    text.parse().unwrap()
}

fn decode(bytes: &[u8]) -> Message {
    Message::decode(&mut Decoder::new(bytes)).unwrap()
}

/// A server's reply of `kind` for our transaction, with `options`.
fn reply(kind: MessageType, yiaddr: &str, options: Vec<DhcpOption>) -> Message {
    let mut message = Message::new_with_id(
        XID,
        Ipv4Addr::UNSPECIFIED,
        ip(yiaddr),
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &MAC,
    );
    message.set_opcode(Opcode::BootReply);
    message.opts_mut().insert(DhcpOption::MessageType(kind));
    for option in options {
        message.opts_mut().insert(option);
    }
    message
}

/// `message` encoded, with raw option bytes `raw` (code, length, data) spliced in before the
/// End option: the wire format itself, not dhcproto's idea of it.
fn with_raw_option(message: &Message, raw: &[u8]) -> Vec<u8> {
    let mut bytes = message.to_vec().unwrap();
    let end = bytes.iter().rposition(|&b| b == 255).unwrap();
    bytes.splice(end..end, raw.iter().copied());
    bytes
}

/// GCE's DHCP answer for a VM: a /32 address, the gateway reached through option 121 (its
/// /32 on the link, then the default route via it), MTU 1460 (option 121 as raw bytes, RFC
/// 3442 encoding: prefix length, significant destination octets, router).
fn gce_reply(kind: MessageType) -> Vec<u8> {
    let message = reply(
        kind,
        "10.128.0.5",
        vec![
            DhcpOption::ServerIdentifier(ip("169.254.169.254")),
            DhcpOption::SubnetMask(ip("255.255.255.255")),
            DhcpOption::Router(vec![ip("10.128.0.1")]),
            DhcpOption::InterfaceMtu(1460),
            DhcpOption::AddressLeaseTime(86400),
        ],
    );
    with_raw_option(
        &message,
        &[
            121, 14, //
            32, 10, 128, 0, 1, 0, 0, 0, 0, // 10.128.0.1/32 on the link
            0, 10, 128, 0, 1, // 0.0.0.0/0 via 10.128.0.1
        ],
    )
}

#[test]
fn discover_and_request_ask_for_a_broadcast_answer_and_the_options_used() {
    let discover = decode(&message::discover(XID, MAC));
    assert_eq!(discover.opcode(), Opcode::BootRequest);
    assert_eq!(discover.xid(), XID);
    assert!(discover.flags().broadcast());
    assert_eq!(&discover.chaddr()[..6], &MAC);
    assert_eq!(discover.ciaddr(), Ipv4Addr::UNSPECIFIED);
    let options = discover.opts();
    assert_eq!(options.msg_type(), Some(MessageType::Discover));
    let Some(DhcpOption::ParameterRequestList(asked)) =
        options.get(OptionCode::ParameterRequestList)
    else {
        panic!("no parameter request list");
    };
    for code in [
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::InterfaceMtu,
        OptionCode::ClasslessStaticRoute,
    ] {
        assert!(asked.contains(&code), "{code:?} not asked for");
    }
    assert!(matches!(
        options.get(OptionCode::ClientIdentifier),
        Some(DhcpOption::ClientIdentifier(id)) if id[..] == [1, 0x42, 0x01, 0x0a, 0x80, 0x00, 0x05]
    ));
    assert!(message::discover(XID, MAC).len() >= 300);

    let request = decode(&message::request(
        XID,
        MAC,
        ip("10.128.0.5"),
        ip("169.254.169.254"),
    ));
    assert_eq!(request.xid(), XID);
    assert!(request.flags().broadcast());
    let options = request.opts();
    assert_eq!(options.msg_type(), Some(MessageType::Request));
    assert!(matches!(
        options.get(OptionCode::RequestedIpAddress),
        Some(DhcpOption::RequestedIpAddress(a)) if *a == ip("10.128.0.5")
    ));
    assert!(matches!(
        options.get(OptionCode::ServerIdentifier),
        Some(DhcpOption::ServerIdentifier(s)) if *s == ip("169.254.169.254")
    ));
}

#[test]
fn a_gce_lease_has_a_host_address_and_reaches_its_gateway_by_option_121() {
    assert_eq!(
        classify(&gce_reply(MessageType::Offer), XID, MAC),
        Some(Reply::Offer {
            address: ip("10.128.0.5"),
            server: ip("169.254.169.254")
        })
    );
    let Some(Reply::Ack(lease)) = classify(&gce_reply(MessageType::Ack), XID, MAC) else {
        panic!("no lease");
    };
    assert_eq!(lease.address, ip("10.128.0.5"));
    assert_eq!(lease.prefix_len, 32);
    assert_eq!(lease.netmask(), ip("255.255.255.255"));
    assert_eq!(lease.gateway, Some(ip("10.128.0.1")));
    assert_eq!(lease.mtu, Some(1460));
    assert_eq!(lease.server, ip("169.254.169.254"));
    assert_eq!(lease.lease_seconds, Some(86400));
    let on_link = Route {
        destination: ip("10.128.0.1"),
        prefix_len: 32,
        gateway: None,
    };
    let default = Route {
        destination: Ipv4Addr::UNSPECIFIED,
        prefix_len: 0,
        gateway: Some(ip("10.128.0.1")),
    };
    assert_eq!(lease.routes, [on_link, default]);
    assert_eq!(lease.routes_to_add(), [on_link, default]);
}

#[test]
fn option_121_wins_over_option_3_and_gateways_get_reached() {
    // RFC 3442: with option 121 the router option is ignored; a route with a partial
    // destination (24 bits: three octets) and one to a gateway outside the subnet.
    let message = reply(
        MessageType::Ack,
        "192.168.1.20",
        vec![
            DhcpOption::ServerIdentifier(ip("192.168.1.1")),
            DhcpOption::SubnetMask(ip("255.255.255.0")),
            DhcpOption::Router(vec![ip("192.168.1.1")]),
        ],
    );
    let bytes = with_raw_option(&message, &[121, 8, 24, 10, 9, 8, 172, 16, 0, 1]);
    let Some(Reply::Ack(lease)) = classify(&bytes, XID, MAC) else {
        panic!("no lease");
    };
    assert_eq!(lease.gateway, None, "no default route in option 121");
    assert_eq!(
        lease.routes_to_add(),
        [
            Route {
                destination: ip("172.16.0.1"),
                prefix_len: 32,
                gateway: None
            },
            Route {
                destination: ip("10.9.8.0"),
                prefix_len: 24,
                gateway: Some(ip("172.16.0.1"))
            },
        ]
    );
}

#[test]
fn without_option_121_the_router_is_the_default_gateway() {
    // QEMU's user network (slirp): a /24 with the router inside it, no MTU, no option 121.
    let inside = reply(
        MessageType::Ack,
        "10.0.2.15",
        vec![
            DhcpOption::ServerIdentifier(ip("10.0.2.2")),
            DhcpOption::SubnetMask(ip("255.255.255.0")),
            DhcpOption::Router(vec![ip("10.0.2.2")]),
            DhcpOption::InterfaceMtu(67),
        ],
    );
    let Some(Reply::Ack(lease)) = classify(&inside.to_vec().unwrap(), XID, MAC) else {
        panic!("no lease");
    };
    assert_eq!((lease.gateway, lease.mtu), (Some(ip("10.0.2.2")), None));
    assert_eq!(
        lease.routes_to_add(),
        [Route {
            destination: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: Some(ip("10.0.2.2"))
        }]
    );

    // A /32 without option 121 and without a mask: the router gets an on-link route first.
    let outside = reply(
        MessageType::Ack,
        "10.128.0.5",
        vec![
            DhcpOption::ServerIdentifier(ip("10.128.0.1")),
            DhcpOption::Router(vec![ip("10.128.0.1")]),
        ],
    );
    let Some(Reply::Ack(lease)) = classify(&outside.to_vec().unwrap(), XID, MAC) else {
        panic!("no lease");
    };
    assert_eq!(lease.prefix_len, 32);
    let routes = lease.routes_to_add();
    assert_eq!(routes.len(), 2);
    assert_eq!(
        (routes[0].destination, routes[0].gateway),
        (ip("10.128.0.1"), None)
    );
    assert_eq!(routes[1].gateway, Some(ip("10.128.0.1")));
}

#[test]
fn replies_for_others_are_ignored_and_bad_acks_are_unusable() {
    let offer = gce_reply(MessageType::Offer);
    assert_eq!(classify(&offer, XID + 1, MAC), None);
    assert_eq!(classify(&offer, XID, [0; 6]), None);
    assert_eq!(classify(&offer[..100], XID, MAC), None);
    assert_eq!(classify(&message::discover(XID, MAC), XID, MAC), None);
    let nak = reply(
        MessageType::Nak,
        "0.0.0.0",
        vec![DhcpOption::ServerIdentifier(ip("10.0.2.2"))],
    );
    assert_eq!(classify(&nak.to_vec().unwrap(), XID, MAC), Some(Reply::Nak));

    let holey_mask = reply(
        MessageType::Ack,
        "10.0.2.15",
        vec![
            DhcpOption::ServerIdentifier(ip("10.0.2.2")),
            DhcpOption::SubnetMask(ip("255.0.255.0")),
        ],
    );
    assert_eq!(
        classify(&holey_mask.to_vec().unwrap(), XID, MAC),
        Some(Reply::UnusableAck(LeaseError::Netmask(ip("255.0.255.0"))))
    );
    let no_server = reply(MessageType::Ack, "10.0.2.15", vec![]);
    assert_eq!(
        classify(&no_server.to_vec().unwrap(), XID, MAC),
        Some(Reply::UnusableAck(LeaseError::NoServer))
    );
    let no_address = reply(
        MessageType::Offer,
        "0.0.0.0",
        vec![DhcpOption::ServerIdentifier(ip("10.0.2.2"))],
    );
    assert_eq!(classify(&no_address.to_vec().unwrap(), XID, MAC), None);
    // A request flag in a reply changes nothing.
    let mut flagged = decode(&offer);
    flagged.set_flags(Flags::default());
    assert!(classify(&flagged.to_vec().unwrap(), XID, MAC).is_some());
}

#[test]
fn hardware_addresses_are_read_from_sysfs_text() {
    assert_eq!(parse_mac("42:01:0a:80:00:05\n"), Some(MAC));
    for bad in [
        "42:01:0a:80:00",
        "42:01:0a:80:00:05:06",
        "42:01:0a:80:00:5",
        "zz:01:0a:80:00:05",
    ] {
        assert_eq!(parse_mac(bad), None, "{bad}");
    }
}
