//! rmw_zenoh's wire conventions (the design document of ros2/rmw_zenoh and its
//! `liveliness_utils.cpp` / `attachment_helpers.cpp`, Jazzy 0.2.4 and later, Kilted, Lyrical):
//! - data: `<domain>/<topic without its leading slash>/<pkg::msg::dds_::Name_>/<RIHS01 hash>`;
//! - every sample carries a 33-byte attachment: sequence number (i64 LE, from 1 per publisher),
//!   source time (i64 LE ns since the Unix epoch), then the publisher's 16-byte GID behind its
//!   LEB128 length `0x10` (zenoh-ext's serialisation of `(i64, i64, [u8; 16])`);
//! - the ROS 2 graph is made of liveliness tokens:
//!   `@ros2_lv/<domain>/<zid>/<node id>/<entity id>/<NN|MP|MS>/<enclave>/<namespace>/<node>[/<topic>/<type>/<hash>/<qos>]`
//!   with every `/` inside a name written `%`.

use super::msgs::RosType;

/// Why a ROS 2 name is refused.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("ROS 2 {what} `{name}`: {why}")]
pub struct NameError {
    /// `namespace`, `node` or `topic`.
    pub what: &'static str,
    /// The name.
    pub name: String,
    /// The rule it breaks.
    pub why: &'static str,
}

fn token_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// Checks a namespace as ROS 2 does: `/`, or `/` followed by tokens (a letter or `_` first,
/// then letters, digits and `_`) separated by single `/`, no trailing `/`.
pub fn check_namespace(ns: &str) -> Result<(), NameError> {
    let err = |why| NameError {
        what: "namespace",
        name: ns.to_string(),
        why,
    };
    let Some(rest) = ns.strip_prefix('/') else {
        return Err(err("must start with `/` (e.g. `/so101`)"));
    };
    if rest.is_empty() {
        return Ok(());
    }
    if rest.split('/').all(token_ok) {
        Ok(())
    } else {
        Err(err(
            "each part must start with a letter or `_` and hold only letters, digits and `_`, with no trailing `/`",
        ))
    }
}

/// Checks a node name: one token.
pub fn check_node(name: &str) -> Result<(), NameError> {
    if token_ok(name) {
        Ok(())
    } else {
        Err(NameError {
            what: "node",
            name: name.to_string(),
            why: "must start with a letter or `_` and hold only letters, digits and `_`",
        })
    }
}

/// The fully qualified name of `topic` (relative tokens joined by `/`) in namespace `ns`.
pub fn qualify(ns: &str, topic: &str) -> String {
    if ns == "/" {
        format!("/{topic}")
    } else {
        format!("{ns}/{topic}")
    }
}

/// `/` written as `%`, as in liveliness tokens.
pub fn mangle(name: &str) -> String {
    name.replace('/', "%")
}

/// The key of a topic's data: `<domain>/<fully qualified topic without its leading slash>/<dds
/// type>/<hash>`.
pub fn data_key(domain: u32, topic_fq: &str, ty: &RosType) -> String {
    let topic = topic_fq.strip_prefix('/').unwrap_or(topic_fq);
    let topic = topic.strip_suffix('/').unwrap_or(topic);
    format!("{domain}/{topic}/{}/{}", ty.dds_name(), ty.hash)
}

/// Reliability and depth of a topic's quality of service (volatile, keep-last, no deadline,
/// lifespan or lease: what reflex offers and asks for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qos {
    /// Reliable (else best effort, as camera streams are).
    pub reliable: bool,
    /// History depth.
    pub depth: u32,
}

impl Qos {
    /// rmw_zenoh's compact form: each value written only where it differs from rmw_zenoh's
    /// default (reliable, volatile, keep-last 42, infinite durations, automatic liveliness):
    /// `<reliability>:<durability>:<history>,<depth>:<deadline s>,<ns>:<lifespan s>,<ns>:<liveliness>,<lease s>,<ns>`.
    pub fn keyexpr(&self) -> String {
        let reliability = if self.reliable { "" } else { "2" };
        let depth = if self.depth == 42 {
            String::new()
        } else {
            self.depth.to_string()
        };
        format!("{reliability}::,{depth}:,:,:,,")
    }
}

/// Kinds of graph entity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntityKind {
    /// A publisher (`MP`).
    Publisher,
    /// A subscription (`MS`).
    Subscription,
}

/// The node's place in the ROS 2 graph: what its liveliness tokens are built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    /// `ROS_DOMAIN_ID`.
    pub domain: u32,
    /// The Zenoh session's id as Zenoh prints it.
    pub zid: String,
    /// Node namespace, e.g. `/so101`.
    pub namespace: String,
    /// Node name.
    pub node: String,
}

impl Graph {
    fn prefix(&self, eid: u32, kind: &str) -> String {
        // Node id 0; the enclave is the default `/`.
        format!(
            "@ros2_lv/{}/{}/0/{eid}/{kind}/%/{}/{}",
            self.domain,
            self.zid,
            mangle(&self.namespace),
            self.node
        )
    }

    /// The node's token (`NN`, entity id = node id = 0).
    pub fn node_token(&self) -> String {
        self.prefix(0, "NN")
    }

    /// A publisher's or subscription's token; entity ids start at 1.
    pub fn entity_token(
        &self,
        eid: u32,
        kind: EntityKind,
        topic_fq: &str,
        ty: &RosType,
        qos: Qos,
    ) -> String {
        let k = match kind {
            EntityKind::Publisher => "MP",
            EntityKind::Subscription => "MS",
        };
        format!(
            "{}/{}/{}/{}/{}",
            self.prefix(eid, k),
            mangle(topic_fq),
            ty.dds_name(),
            ty.hash,
            qos.keyexpr()
        )
    }
}

/// An entity's GID as rmw_zenoh makes its own: XXH3-128 of its liveliness token, low then high
/// 64 bits, little-endian.
pub fn gid(token: &str) -> [u8; 16] {
    let h = xxhash_rust::xxh3::xxh3_128(token.as_bytes());
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&(h as u64).to_le_bytes());
    g[8..].copy_from_slice(&((h >> 64) as u64).to_le_bytes());
    g
}

/// Bytes of an attachment.
pub const ATTACHMENT_LEN: usize = 33;

/// The attachment of every sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// Per-publisher sequence number, from 1.
    pub seq: i64,
    /// Source time, ns since the Unix epoch.
    pub source_ns: i64,
    /// The publisher's GID.
    pub gid: [u8; 16],
}

impl Attachment {
    /// Its 33 bytes.
    pub fn encode(&self) -> [u8; ATTACHMENT_LEN] {
        let mut b = [0u8; ATTACHMENT_LEN];
        b[..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.source_ns.to_le_bytes());
        b[16] = 16;
        b[17..].copy_from_slice(&self.gid);
        b
    }

    /// Reads one; the length and the GID's length byte must be exact.
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != ATTACHMENT_LEN || b[16] != 16 {
            return Err(format!(
                "attachment of {} bytes (GID length byte {:?}); rmw_zenoh >= 0.2.4 sends {ATTACHMENT_LEN} with 0x10",
                b.len(),
                b.get(16)
            ));
        }
        Ok(Attachment {
            seq: i64::from_le_bytes(b[..8].try_into().expect("8")),
            source_ns: i64::from_le_bytes(b[8..16].try_into().expect("8")),
            gid: b[17..].try_into().expect("16"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs;

    #[test]
    fn keys_and_tokens_match_the_design_documents_examples() {
        // rmw_zenoh docs/design.md: the listener's subscription on /chatter.
        const STRING: RosType = RosType {
            name: "std_msgs/msg/String",
            hash: "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18",
        };
        assert_eq!(
            data_key(0, "/robot1/chatter", &STRING),
            "0/robot1/chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18"
        );
        let g = Graph {
            domain: 0,
            zid: "aac3178e146ba6f1fc6e6a4085e77f21".into(),
            namespace: "/".into(),
            node: "listener".into(),
        };
        assert_eq!(
            g.node_token(),
            "@ros2_lv/0/aac3178e146ba6f1fc6e6a4085e77f21/0/0/NN/%/%/listener"
        );
        let q = Qos {
            reliable: true,
            depth: 10,
        };
        assert_eq!(
            g.entity_token(10, EntityKind::Subscription, "/chatter", &STRING, q),
            "@ros2_lv/0/aac3178e146ba6f1fc6e6a4085e77f21/0/10/MS/%/%/listener/%chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18/::,10:,:,:,,"
        );
        assert_eq!(
            Qos {
                reliable: false,
                depth: 5
            }
            .keyexpr(),
            "2::,5:,:,:,,"
        );
        let g = Graph {
            namespace: "/so101".into(),
            node: "reflex".into(),
            ..g
        };
        assert!(
            g.entity_token(1, EntityKind::Publisher, "/so101/joint_states", &msgs::JOINT_STATE, q)
                .starts_with("@ros2_lv/0/aac3178e146ba6f1fc6e6a4085e77f21/0/1/MP/%/%so101/reflex/%so101%joint_states/sensor_msgs::msg::dds_::JointState_/RIHS01_a13e")
        );
    }

    #[test]
    fn the_attachment_is_33_bytes_in_rmw_zenohs_order() {
        let a = Attachment {
            seq: 1,
            source_ns: 1_700_000_000_123_456_789,
            gid: std::array::from_fn(|i| i as u8),
        };
        let b = a.encode();
        // The design brief's computed example.
        assert_eq!(
            b[..17],
            [
                1, 0, 0, 0, 0, 0, 0, 0, 0x15, 0xcd, 0x85, 0x3d, 0xfe, 0x9c, 0x97, 0x17, 0x10
            ]
        );
        assert_eq!(Attachment::decode(&b).unwrap(), a);
        assert!(Attachment::decode(&b[..32]).is_err());
        let mut old = b;
        old[16] = 15;
        assert!(Attachment::decode(&old).is_err());
    }

    #[test]
    fn names_are_checked_as_ros_2_does() {
        assert!(check_namespace("/").is_ok());
        assert!(check_namespace("/so101").is_ok());
        assert!(check_namespace("/lab/arm_2").is_ok());
        for bad in ["so101", "/so101/", "/1arm", "/a//b", "/a-b"] {
            assert!(check_namespace(bad).is_err(), "{bad}");
        }
        assert!(check_node("reflex").is_ok());
        assert!(check_node("re/flex").is_err());
        assert_eq!(qualify("/", "tf"), "/tf");
        assert_eq!(qualify("/so101", "servo/twist"), "/so101/servo/twist");
        assert_ne!(gid("a"), gid("b"));
    }
}
