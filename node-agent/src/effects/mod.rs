//! What touches the node: each module here performs one kind of side effect and decides nothing
//! (the decisions are [`crate::lifecycle`]'s).
pub mod admin_socket;
pub mod envoy_admin;
pub mod hold;
pub(crate) mod http1_client;
pub mod netns;
pub(crate) mod netns_claims;
pub mod node_taint;
pub mod procfs;
