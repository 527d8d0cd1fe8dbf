//! Private data over the IB CM: the consumer's limits per message, and the 36-byte CMA
//! header rdma_cm puts in front of the consumer's data in REQ and SIDR_REQ.

use softrdma_verbs::{bail, Result};
use softrdma_wire::ibcm::{
    CmaHeader, CMA_HDR_LEN, REJ_PRIVATE_LEN, REP_PRIVATE_LEN, REQ_PRIVATE_LEN, SIDR_REP_PRIVATE_LEN,
    SIDR_REQ_PRIVATE_LEN,
};

/// Consumer bytes in a REQ (`rdma_connect`, RC): 92 minus the CMA header.
pub const REQ_USER_LEN: usize = REQ_PRIVATE_LEN - CMA_HDR_LEN;
/// Consumer bytes in a SIDR_REQ (`rdma_connect`, UD): 216 minus the CMA header.
pub const SIDR_REQ_USER_LEN: usize = SIDR_REQ_PRIVATE_LEN - CMA_HDR_LEN;
/// Consumer bytes in a REP (`rdma_accept`, RC).
pub const REP_USER_LEN: usize = REP_PRIVATE_LEN;
/// Consumer bytes in a REJ (`rdma_reject`, RC).
pub const REJ_USER_LEN: usize = REJ_PRIVATE_LEN;
/// Consumer bytes in a SIDR_REP (`rdma_accept` / `rdma_reject`, UD).
pub const SIDR_REP_USER_LEN: usize = SIDR_REP_PRIVATE_LEN;

/// EINVAL when `len` consumer bytes do not fit `max` (naming the call and both numbers).
pub fn check(op: &str, what: &str, len: usize, max: usize) -> Result<()> {
    if len > max {
        bail!(
            Inval,
            "{op}: private data of {len} bytes exceeds the RoCE limit of {max} bytes ({what})"
        );
    }
    Ok(())
}

/// The private-data field of `N` bytes: `hdr`, then `user`.
pub fn with_header<const N: usize>(hdr: &CmaHeader, user: &[u8]) -> Result<[u8; N]> {
    check(
        "rdma_connect",
        "after the 36-byte CMA header",
        user.len(),
        N - CMA_HDR_LEN,
    )?;
    let h = hdr
        .emit()
        .map_err(|e| softrdma_verbs::Error::inval(format!("rdma_connect: CMA header: {e}")))?;
    let mut out = [0u8; N];
    out[..CMA_HDR_LEN].copy_from_slice(&h);
    out[CMA_HDR_LEN..CMA_HDR_LEN + user.len()].copy_from_slice(user);
    Ok(out)
}

/// Splits a received REQ / SIDR_REQ private-data field into the CMA header and the consumer's
/// bytes (the whole rest of the field, zero padded, as the kernel reports it).
pub fn split_header(field: &[u8]) -> std::result::Result<(CmaHeader, Vec<u8>), String> {
    let hdr = CmaHeader::parse(field).map_err(|e| format!("bad CMA header: {e}"))?;
    Ok((hdr, field[CMA_HDR_LEN..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_verbs::Errno;

    #[test]
    fn limits() {
        assert_eq!(
            (
                REQ_USER_LEN,
                SIDR_REQ_USER_LEN,
                REP_USER_LEN,
                REJ_USER_LEN,
                SIDR_REP_USER_LEN
            ),
            (56, 180, 196, 148, 136)
        );
        assert!(check("rdma_accept", "REP", 196, REP_USER_LEN).is_ok());
        let e = check("rdma_accept", "REP", 197, REP_USER_LEN).unwrap_err();
        assert_eq!(e.errno, Errno::Inval);
        assert!(e.msg.contains("197") && e.msg.contains("196"), "{e}");
    }

    #[test]
    fn header_round_trip() {
        let hdr = CmaHeader {
            src_port: 4000,
            src: "127.0.0.1".parse().unwrap(),
            dst: "127.0.0.2".parse().unwrap(),
        };
        let f: [u8; REQ_PRIVATE_LEN] = with_header(&hdr, b"hello").unwrap();
        let (h, user) = split_header(&f).unwrap();
        assert_eq!(h, hdr);
        assert_eq!(user.len(), 56);
        assert_eq!(&user[..5], b"hello");
        assert!(with_header::<REQ_PRIVATE_LEN>(&hdr, &[1; 56]).is_ok());
        let e = with_header::<REQ_PRIVATE_LEN>(&hdr, &[1; 57]).unwrap_err();
        assert!(e.msg.contains("57") && e.msg.contains("56"), "{e}");
        assert!(split_header(&[1u8; 92]).is_err());
    }
}
