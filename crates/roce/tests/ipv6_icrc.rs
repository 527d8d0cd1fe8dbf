//! An IPv6 datagram with a bad ICRC is checked as IPv6 and dropped (its own test binary: the
//! other loopback tests assert that no ICRC error happened in their process).

use softrdma_roce::driver::{create_qp, driver_stats, split_qpn};
use softrdma_verbs::*;
use std::time::Duration;

/// The tests here count the driver's ICRC errors: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn ipv6_datagram_with_a_bad_icrc_is_dropped() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    send_bad_icrc_from(std::net::UdpSocket::bind("[::1]:0").unwrap());
}

/// Linux rdma_rxe sends RoCEv2 over IPv6 with UDP checksum 0 (RFC 6935/6936); the host's UDP
/// stack drops such datagrams unless the socket accepts them (UDP_NO_CHECK6_RX). A datagram
/// sent with UDP_NO_CHECK6_TX must reach the driver's ICRC check.
#[test]
fn ipv6_datagram_with_udp_checksum_zero_reaches_the_driver() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let sock = std::net::UdpSocket::bind("[::1]:0").unwrap();
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads size_of::<c_int>() bytes from a live local; the fd is open.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::IPPROTO_UDP,
            libc::UDP_NO_CHECK6_TX,
            std::ptr::from_ref(&on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "UDP_NO_CHECK6_TX: {}", std::io::Error::last_os_error());
    send_bad_icrc_from(sock);
}

/// Sends a SEND_ONLY with a bad ICRC from `sock` to a live QP on ::1 and waits until the
/// driver counted it as an ICRC error (not as unsupported).
fn send_bad_icrc_from(sock: std::net::UdpSocket) {
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
