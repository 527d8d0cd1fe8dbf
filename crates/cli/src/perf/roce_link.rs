//! RoCE QPs for `softrdma perf`, connected the way perftest connects them without `-R`: each
//! side sends its QP number, first PSN and GID, together with the test's request or reply,
//! over a TCP connection to the perf port, then moves its QP through RTR to RTS. The server
//! reaches RTR before it replies, so the client's first packet finds it ready. Closing the
//! TCP connection ends the run.

use super::endpoint::Endpoint;
use softrdma_verbs::device::DeviceInfo;
use softrdma_verbs::qp_state::attr_mask;
use softrdma_verbs::{AhAttr, Errno, Error, Qp, QpAttr, QpState, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

/// Longest private data a message carries.
const MAX_PRIVATE: usize = 256;
/// Outstanding RDMA READs each side allows.
const RD_ATOMIC: u8 = 16;

/// What the peer needs to address one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
}

/// This side's QP: its number, a first PSN, and the GID of `local_ip` with its index.
pub fn local_info(qp: &Qp, dev: &DeviceInfo, local_ip: IpAddr) -> Result<(QpInfo, u8)> {
    let index = dev.gid_index_of(local_ip).ok_or_else(|| {
        Error::new(
            Errno::AddrNotAvail,
            format!(
                "{}: no GID stands for {local_ip}, the address of the perf connection",
                dev.name
            ),
        )
    })?;
    let gid = dev
        .gid(index)
        .ok_or_else(|| Error::new(Errno::AddrNotAvail, format!("{}: GID {index} is gone", dev.name)))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let psn = (nanos ^ qp.qpn().rotate_left(7)) & 0x00ff_ffff;
    let info = QpInfo {
        qpn: qp.qpn(),
        psn,
        gid: gid.0,
    };
    Ok((info, index as u8))
}

/// Writes one message: private data, then the QP's address.
pub fn send(stream: &mut TcpStream, private: &[u8], info: &QpInfo) -> std::io::Result<()> {
    let len = private.len().min(MAX_PRIVATE);
    let mut msg = Vec::with_capacity(2 + len + 24);
    msg.extend_from_slice(&(len as u16).to_le_bytes());
    msg.extend_from_slice(&private[..len]);
    msg.extend_from_slice(&info.qpn.to_le_bytes());
    msg.extend_from_slice(&info.psn.to_le_bytes());
    msg.extend_from_slice(&info.gid);
    stream.write_all(&msg)
}

/// Reads one message written by [`send`].
pub fn receive(stream: &mut TcpStream) -> std::io::Result<(Vec<u8>, QpInfo)> {
    let mut len = [0u8; 2];
    stream.read_exact(&mut len)?;
    let len = usize::from(u16::from_le_bytes(len));
    if len > MAX_PRIVATE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a softrdma perf peer ({len} bytes of private data announced)"),
        ));
    }
    let mut private = vec![0u8; len];
    stream.read_exact(&mut private)?;
    let mut rest = [0u8; 24];
    stream.read_exact(&mut rest)?;
    let u32_at = |i: usize| u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&rest[8..]);
    Ok((
        private,
        QpInfo {
            qpn: u32_at(0),
            psn: u32_at(4),
            gid,
        },
    ))
}

/// INIT → RTR → RTS towards `peer`, sending from GID `sgid_index`.
pub fn connect_qp(ep: &Endpoint, dev: &DeviceInfo, sgid_index: u8, local: &QpInfo, peer: &QpInfo) -> Result<()> {
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: dev.port_attr().active_mtu as u8,
        dest_qp_num: peer.qpn,
        rq_psn: peer.psn,
        max_dest_rd_atomic: RD_ATOMIC,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dgid: peer.gid,
            sgid_index,
            hop_limit: 64,
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    ep.qp.modify(&rtr, attr_mask::STATE | attr_mask::RC_RTR_REQUIRED)?;
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: local.psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: RD_ATOMIC,
        ..QpAttr::default()
    };
    ep.qp.modify(&rts, attr_mask::STATE | attr_mask::RC_RTS_REQUIRED)
}

/// The client's side: sends `private` and this QP's address to `dst`, connects the QP to
/// the server's, and returns the stream and the server's private data.
pub fn connect(
    ep: &Endpoint,
    dev: &DeviceInfo,
    dst: SocketAddr,
    private: &[u8],
    timeout: Duration,
) -> std::result::Result<(TcpStream, Vec<u8>), Box<dyn std::error::Error>> {
    let mut stream = TcpStream::connect_timeout(&dst, timeout)
        .map_err(|e| format!("connect to {dst} (TCP, for the QP exchange): {e}"))?;
    stream.set_read_timeout(Some(timeout))?;
    let _ = stream.set_nodelay(true);
    let (local, sgid) = local_info(&ep.qp, dev, stream.local_addr()?.ip())?;
    send(&mut stream, private, &local)?;
    let (reply, peer) = receive(&mut stream).map_err(|e| format!("{dst}: no QP exchange reply: {e}"))?;
    connect_qp(ep, dev, sgid, &local, &peer)?;
    stream.set_read_timeout(None)?;
    Ok((stream, reply))
}

/// The server's side, after [`receive`] read the client's message from `stream`: connects
/// the QP to the client's and replies with `private` and this QP's address.
pub fn accept(
    ep: &Endpoint,
    dev: &DeviceInfo,
    stream: &mut TcpStream,
    peer: &QpInfo,
    private: &[u8],
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let (local, sgid) = local_info(&ep.qp, dev, stream.local_addr()?.ip())?;
    connect_qp(ep, dev, sgid, &local, peer)?;
    send(stream, private, &local)?;
    Ok(())
}

/// Waits until the peer closes `stream` (the end of the run), at most `limit`.
pub fn wait_hangup(stream: &mut TcpStream, limit: Duration) {
    let _ = stream.set_read_timeout(Some(limit));
    let mut b = [0u8; 64];
    while matches!(stream.read(&mut b), Ok(n) if n > 0) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn messages_round_trip_and_oversized_ones_are_refused() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let info = QpInfo {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            gid: [7; 16],
        };
        send(&mut a, b"hello", &info).unwrap();
        assert_eq!(receive(&mut b).unwrap(), (b"hello".to_vec(), info));
        a.write_all(&[0xff, 0xff]).unwrap();
        let e = receive(&mut b).unwrap_err();
        assert!(e.to_string().contains("not a softrdma perf peer"), "{e}");
    }
}
