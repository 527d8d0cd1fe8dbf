//! `#[repr(C)]` mirrors of the rdma-core 44 structs that cross the C boundary.
//!
//! Every struct and union is declared through [`c_struct!`] / [`c_union!`], which also records
//! its C spelling and field list. Two checks keep the mirrors exact:
//! - [`offsets`]: compile-time `offset_of!`/`size_of` asserts with the numbers of
//!   `abi-offsets.txt` (x86_64, printed from the real headers);
//! - the `c_layout` unit test: compiles a C program against the installed headers
//!   (`libibverbs-dev`, `librdmacm-dev`) that prints `offsetof`/`sizeof`/`_Alignof` of every
//!   field and struct declared here, and compares them with Rust's values.
//!
//! Names follow C (`ibv_device`, `rdma_cm_id`), so the test can spell every field in C.
//! Function pointers are always `Option<unsafe extern "C" fn ...>`, so the all-zero value of
//! every type here is valid ([`zeroed`](ibv_device::zeroed)).

#![allow(non_camel_case_types)]

pub mod cma;
pub mod kern;
pub mod offsets;
pub mod verbs;

#[cfg(test)]
mod c_layout;

pub use cma::*;
pub use kern::*;
pub use verbs::*;

/// One field as the layout test sees it.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// C member name (a Rust raw identifier such as `r#priv` is reported without `r#`).
    pub name: &'static str,
    /// `offset_of!` in Rust.
    pub offset: usize,
    /// Size of the Rust field type.
    pub size: usize,
}

/// One type as the layout test sees it.
#[cfg(test)]
#[derive(Debug, Clone)]
pub struct TypeLayout {
    /// C type expression, e.g. `struct ibv_device` or `__typeof__(((union ibv_gid *)0)->global)`.
    pub c_type: &'static str,
    /// Rust type name.
    pub rust_name: &'static str,
    /// `size_of` in Rust.
    pub size: usize,
    /// `align_of` in Rust.
    pub align: usize,
    /// Every field.
    pub fields: Vec<Field>,
}

/// Declares `#[repr(C)]` structs mirroring C structs, plus (under `cfg(test)`) the function
/// `$registry()` listing their layouts for the C comparison test; see the module docs.
macro_rules! c_struct {
    (
        registry $registry:ident;
        $(
            $(#[doc = $doc:literal])*
            #[c = $c:literal]
            $(#[derive($($derive:ident),*)])?
            pub struct $name:ident {
                $($(#[doc = $fdoc:literal])* pub $field:ident: $ty:ty,)*
            }
        )*
    ) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            $(#[derive($($derive),*)])?
            pub struct $name {
                $($(#[doc = $fdoc])* pub $field: $ty,)*
            }

            impl $name {
                /// The all-zero value (valid: the fields are integers, arrays, raw pointers,
                /// `Option` function pointers and other types declared with these macros).
                #[allow(dead_code)]
                pub fn zeroed() -> Self {
                    // SAFETY: every field type of this struct accepts the all-zero bit pattern
                    // (integers, arrays of them, raw pointers, Option<fn>, libc pthread and
                    // sockaddr byte containers, and types declared with c_struct!/c_union!).
                    unsafe { ::core::mem::zeroed() }
                }
            }
        )*

        /// Layouts of the structs declared in this block.
        #[cfg(test)]
        pub fn $registry() -> Vec<$crate::abi::TypeLayout> {
            vec![$($crate::abi::TypeLayout {
                c_type: $c,
                rust_name: stringify!($name),
                size: ::core::mem::size_of::<$name>(),
                align: ::core::mem::align_of::<$name>(),
                fields: vec![$($crate::abi::Field {
                    name: stringify!($field),
                    offset: ::core::mem::offset_of!($name, $field),
                    size: ::core::mem::size_of::<$ty>(),
                },)*],
            },)*]
        }
    };
}

/// Declares `#[repr(C)]` unions mirroring C unions, plus (under `cfg(test)`) `$registry()`;
/// see [`c_struct!`].
macro_rules! c_union {
    (
        registry $registry:ident;
        $(
            $(#[doc = $doc:literal])*
            #[c = $c:literal]
            pub union $name:ident {
                $($(#[doc = $fdoc:literal])* pub $field:ident: $ty:ty,)*
            }
        )*
    ) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive(Clone, Copy)]
            pub union $name {
                $($(#[doc = $fdoc])* pub $field: $ty,)*
            }
        )*

        /// Layouts of the unions declared in this block.
        #[cfg(test)]
        pub fn $registry() -> Vec<$crate::abi::TypeLayout> {
            vec![$($crate::abi::TypeLayout {
                c_type: $c,
                rust_name: stringify!($name),
                size: ::core::mem::size_of::<$name>(),
                align: ::core::mem::align_of::<$name>(),
                fields: vec![$($crate::abi::Field {
                    name: stringify!($field),
                    offset: ::core::mem::offset_of!($name, $field),
                    size: ::core::mem::size_of::<$ty>(),
                },)*],
            },)*]
        }
    };
}

pub(crate) use c_struct;
pub(crate) use c_union;
