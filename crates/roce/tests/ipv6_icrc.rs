//! An IPv6 datagram with a bad ICRC is checked as IPv6 and dropped (its own test binary: the
//! other loopback tests assert that no ICRC error happened in their process).

use softrdma_roce::driver::{create_qp, driver_stats, split_qpn};
use softrdma_verbs::*;
use std::time::Duration;

#[test]
fn ipv6_datagram_with_a_bad_icrc_is_dropped() {
    let ctx = Context::open(&device::find_device("rxe_lo").unwrap_or_else(|e| panic!("{e}"))).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let qp = create_qp(&pd, init).unwrap();
    let (port, _) = split_qpn(qp.qpn()).expect("a soft-RoCE QPN names its home port");
    // A BTH (SEND_ONLY to the QP) with a payload and an ICRC of zeros.
    let mut d = vec![0x04u8, 0, 0xff, 0xff];
    d.extend_from_slice(&qp.qpn().to_be_bytes());
    d[4] = 0;
    d.extend_from_slice(&[0u8; 4 + 16 + 4]);
    let before = driver_stats();
    let sock = std::net::UdpSocket::bind("[::1]:0").unwrap();
    sock.send_to(&d, ("::1", port)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while driver_stats().icrc_errors == before.icrc_errors {
        assert!(
            std::time::Instant::now() < deadline,
            "not counted: {:?}",
            driver_stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        driver_stats().unsupported,
        before.unsupported,
        "IPv6 is no longer unsupported"
    );
}
