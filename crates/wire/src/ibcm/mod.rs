//! InfiniBand Communication Manager MADs (IBTA vol. 1 ch. 12) and the
//! rdma_cm private-data header, sans I/O.
//!
//! [`CmMad::parse`] takes the 256-byte MAD (for RoCEv2: the payload of a UD
//! SEND to QP1 after the DETH) and returns the transaction ID and a typed
//! [`CmMessage`]; [`CmMad::emit`] produces the 256 bytes. Every bit field of
//! REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ and SIDR_REP is a typed
//! field; private data is a fixed array of the field's full length
//! (`*_PRIVATE_LEN`), and the rdma_cm layer decides how much of it is
//! meaningful. Reserved bits are ignored on receive and sent as zero; values
//! wider than their field are masked on emit. LAP and APR are refused
//! (rdma_cm does not use them).
//!
//! ```
//! use softrdma_wire::ibcm::*;
//!
//! // Active side: a REQ to TCP-port-space port 7174 with the CMA header first.
//! let cma = CmaHeader {
//!     src_port: 41000,
//!     src: "192.0.2.1".parse().unwrap(),
//!     dst: "192.0.2.2".parse().unwrap(),
//! };
//! let mut private_data = [0u8; REQ_PRIVATE_LEN];
//! private_data[..CMA_HDR_LEN].copy_from_slice(&cma.emit().unwrap());
//! let req = Req {
//!     local_comm_id: 0x1111_1111,
//!     service_id: service_id(PortSpace::Tcp, 7174),
//!     local_qpn: 0x11,
//!     remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
//!     max_cm_retries: CMA_MAX_CM_RETRIES,
//!     private_data,
//!     ..Req::default()
//! };
//! let mad = CmMad { tid: 42, msg: CmMessage::Req(req) }.emit();
//!
//! // Passive side.
//! let got = CmMad::parse(&mad).unwrap();
//! let CmMessage::Req(r) = got.msg else { panic!("not a REQ") };
//! assert_eq!(service_id_parts(r.service_id), Some((PortSpace::Tcp, 7174)));
//! assert_eq!(CmaHeader::parse(&r.private_data).unwrap(), cma);
//! assert_eq!(cm_timeout_ms(r.remote_cm_response_timeout), 4096);
//! ```

mod cma;
mod fields;
mod mad;
mod message;
mod reject;
mod rep;
mod req;
mod sidr;
mod simple;
mod timer;

pub use self::cma::{
    service_id, service_id_parts, CmaHeader, PortSpace, CMA_HDR_LEN, CMA_VERSION, IB_CMA_SERVICE_ID,
    IB_CMA_SERVICE_ID_MASK,
};
pub use self::mad::{
    CmAttr, MadHeader, CM_CLASS_VERSION, CM_MGMT_CLASS, GSI_QKEY, MAD_BASE_VERSION, MAD_DATA_LEN, MAD_HDR_LEN, MAD_LEN,
    MAD_METHOD_SEND,
};
pub use self::message::{CmMad, CmMessage, CM_MSG_OTHER, CM_MSG_REP, CM_MSG_REQ};
pub use self::reject::{Rej, RejReason, REJ_ARI_LEN, REJ_PRIVATE_LEN};
pub use self::rep::{Rep, REP_PRIVATE_LEN};
pub use self::req::{CmPath, Req, CM_PATH_LEN, CM_TRANSPORT_RC, CM_TRANSPORT_UC, REQ_PRIVATE_LEN};
pub use self::sidr::{SidrRep, SidrReq, SidrStatus, SIDR_REP_ADD_INFO_LEN, SIDR_REP_PRIVATE_LEN, SIDR_REQ_PRIVATE_LEN};
pub use self::simple::{Drep, Dreq, Mra, Rtu, DREP_PRIVATE_LEN, DREQ_PRIVATE_LEN, MRA_PRIVATE_LEN, RTU_PRIVATE_LEN};
pub use self::timer::{cm_req_timeout_ms, cm_timeout_ms, CMA_CM_RESPONSE_TIMEOUT, CMA_MAX_CM_RETRIES};

/// Copies `data` into a zero-filled private-data array of a CM field's length
/// (e.g. `private_data::<REP_PRIVATE_LEN>(b"hi")`); Malformed if it does not fit.
pub fn private_data<const N: usize>(data: &[u8]) -> Result<[u8; N], crate::WireError> {
    let mut out = [0u8; N];
    out.get_mut(..data.len())
        .ok_or(crate::WireError::Malformed("private data longer than the CM field"))?
        .copy_from_slice(data);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_padding() {
        let pd: [u8; REP_PRIVATE_LEN] = private_data(b"hi").unwrap();
        assert_eq!(&pd[..3], b"hi\0");
        assert!(private_data::<RTU_PRIVATE_LEN>(&[1; RTU_PRIVATE_LEN]).is_ok());
        assert_eq!(
            private_data::<REQ_PRIVATE_LEN>(&[1; 93]),
            Err(crate::WireError::Malformed("private data longer than the CM field"))
        );
    }
}
