//! A link only the right peers can use: Zenoh over TLS with mutual authentication (every peer
//! shows a certificate signed by the robot's own certificate authority), and Zenoh's access
//! control on the robot's key space by the certificate's common name:
//! - every authenticated peer may watch (subscribe, query, liveliness) and may raise an e-stop
//!   (`reflex/<robot>/events`);
//! - only the configured teleop devices may command or take over (`reflex/<robot>/teleop`) and
//!   release or resume an e-stop (`reflex/<robot>/operator`);
//! - only the configured learners may publish weights and learner state
//!   (`reflex/<robot>/learn/{state,weights}`, `alive/learner`);
//! - anything else from a peer (a viewer publishing commands, a peer driving the robot's `cmd`)
//!   is dropped by Zenoh before it reaches reflex.
//!
//! `reflex keys init` makes the authority and the peers' certificates ([`init_keys`]).

use crate::BusError;
use std::path::{Path, PathBuf};

/// The three files a peer needs: the authority's certificate, its own certificate and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate authority every peer trusts (`ca.pem`).
    pub ca: PathBuf,
    /// This peer's certificate (`<name>.pem`).
    pub cert: PathBuf,
    /// This peer's private key (`<name>.key`), readable by its owner only.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files of peer `name` in a directory `reflex keys init` wrote.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        }
    }

    /// Checks the files exist and the key is not readable by anyone but its owner.
    pub fn check(&self) -> Result<(), BusError> {
        for p in [&self.ca, &self.cert, &self.key] {
            if !p.is_file() {
                return Err(BusError::Config(format!(
                    "TLS file `{}` does not exist (make the keys with `reflex keys init`)",
                    p.display()
                )));
            }
        }
        check_private(&self.key)
    }
}

/// Refuses a private key that its group or others can read or write.
pub fn check_private(key: &Path) -> Result<(), BusError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(key)
        .map_err(|e| BusError::Config(format!("key file `{}`: {e}", key.display())))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(BusError::Config(format!(
            "key file `{}` is readable by others (mode {:o}): anyone on this machine could act as this peer; run `chmod 600 {}`",
            key.display(),
            mode & 0o777,
            key.display()
        )));
    }
    Ok(())
}

/// Who may do what on a robot's key space, by certificate common name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Peers that may publish weights and learner state.
    pub learners: Vec<String>,
    /// Peers that may command and take over, and release and resume an e-stop.
    pub teleops: Vec<String>,
    /// Peers that may only watch (and raise an e-stop).
    pub viewers: Vec<String>,
    /// With `[ros2]` on: the ROS 2 domain and the data key prefix of the node's topics
    /// (`0/so101`). Every peer may then watch the ROS 2 graph and topics and raise the e-stop
    /// from ROS 2; only teleop peers may drive the robot with a twist.
    pub ros2: Option<(u32, String)>,
}

fn json_list(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", items.join(","))
}

impl Access {
    /// The `access_control` section of the robot's Zenoh config: deny by default, then the
    /// rules above. Every name in it must be a peer's certificate common name.
    pub fn zenoh_acl(&self, robot: &str) -> String {
        let all: Vec<String> = self
            .learners
            .iter()
            .chain(&self.teleops)
            .chain(&self.viewers)
            .cloned()
            .collect();
        let k = |s: &str| format!("\"reflex/{robot}/{s}\"");
        // ROS 2 (rmw_zenoh): topics under `<domain>/<namespace>/`, `/tf` and `/diagnostics` at
        // the domain's root, the graph under `@ros2_lv/<domain>/`; a ROS 2 node declares its
        // own liveliness tokens, which every peer may.
        let (mut watch, mut estop, mut teleop) = (
            vec![k("**")],
            vec![k("events")],
            vec![k("teleop"), k("operator")],
        );
        let mut graph = String::new();
        if let Some((domain, prefix)) = &self.ros2 {
            let q = |s: &str| format!("\"{s}\"");
            watch.extend([
                q(&format!("{prefix}/**")),
                q(&format!("{domain}/tf/**")),
                q(&format!("{domain}/diagnostics/**")),
                q(&format!("@ros2_lv/{domain}/**")),
            ]);
            estop.push(q(&format!("{prefix}/estop/**")));
            teleop.push(q(&format!("{prefix}/servo/twist/**")));
            graph = format!(
                r#",
    {{"id": "ros2_graph", "key_exprs": [{}], "flows": ["ingress"], "permission": "allow",
      "messages": ["liveliness_token"]}}"#,
                q(&format!("@ros2_lv/{domain}/**"))
            );
        }
        let mut subjects = vec![format!(
            r#"{{"id": "peers", "cert_common_names": {}}}"#,
            json_list(&all)
        )];
        let mut policies = vec![
            if self.ros2.is_some() {
                r#"{"rules": ["out", "watch", "estop", "ros2_graph"], "subjects": ["peers"]}"#
            } else {
                r#"{"rules": ["out", "watch", "estop"], "subjects": ["peers"]}"#
            }
            .to_string(),
        ];
        if !self.teleops.is_empty() {
            subjects.push(format!(
                r#"{{"id": "teleops", "cert_common_names": {}}}"#,
                json_list(&self.teleops)
            ));
            policies.push(r#"{"rules": ["teleop"], "subjects": ["teleops"]}"#.into());
        }
        if !self.learners.is_empty() {
            subjects.push(format!(
                r#"{{"id": "learners", "cert_common_names": {}}}"#,
                json_list(&self.learners)
            ));
            policies.push(r#"{"rules": ["learn"], "subjects": ["learners"]}"#.into());
        }
        format!(
            r#"{{
  "enabled": true,
  "default_permission": "deny",
  "rules": [
    {{"id": "out", "key_exprs": ["**"], "flows": ["egress"], "permission": "allow",
      "messages": ["put", "delete", "declare_subscriber", "query", "declare_queryable", "reply",
                   "liveliness_token", "declare_liveliness_subscriber", "liveliness_query"]}},
    {{"id": "watch", "key_exprs": [{watch}], "flows": ["ingress"], "permission": "allow",
      "messages": ["declare_subscriber", "query", "declare_liveliness_subscriber", "liveliness_query"]}},
    {{"id": "estop", "key_exprs": [{estop}], "flows": ["ingress"], "permission": "allow",
      "messages": ["put"]}},
    {{"id": "teleop", "key_exprs": [{teleop}], "flows": ["ingress"], "permission": "allow",
      "messages": ["put"]}},
    {{"id": "learn", "key_exprs": [{state}, {weights}, {alive}], "flows": ["ingress"],
      "permission": "allow",
      "messages": ["put", "liveliness_token", "declare_queryable", "reply"]}}{graph}
  ],
  "subjects": [{subjects}],
  "policies": [{policies}]
}}"#,
            watch = watch.join(", "),
            estop = estop.join(", "),
            teleop = teleop.join(", "),
            state = k("learn/state"),
            weights = k("learn/weights"),
            alive = k("alive/learner"),
            subjects = subjects.join(", "),
            policies = policies.join(", "),
        )
    }
}

/// What `reflex keys init` made.
#[derive(Clone, Debug)]
pub struct KeySet {
    /// The authority's certificate (`ca.pem`); its key (`ca.key`) stays beside it.
    pub ca: PathBuf,
    /// Each peer's (name, certificate, key).
    pub peers: Vec<(String, PathBuf, PathBuf)>,
}

fn write_file(path: &Path, text: &str, private: bool) -> Result<(), BusError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |e: std::io::Error| BusError::Keys(format!("`{}`: {e}", path.display()));
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Validity of a certificate: (not before, not after).
pub type Validity = (time::OffsetDateTime, time::OffsetDateTime);

/// From yesterday (clocks disagree) for `days` days.
pub fn valid_for_days(days: i64) -> Validity {
    let now = time::OffsetDateTime::now_utc();
    (
        now - time::Duration::days(1),
        now + time::Duration::days(days),
    )
}

/// A certificate for peer `name` signed by `issuer`, written to `<dir>/<name>.pem` and
/// `<dir>/<name>.key` (mode 600).
fn issue_peer<S: rcgen::SigningKey>(
    dir: &Path,
    name: &str,
    hosts: &[String],
    (from, to): Validity,
    issuer: &rcgen::Issuer<'_, S>,
) -> Result<(String, PathBuf, PathBuf), BusError> {
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
    let err = |e: rcgen::Error| BusError::Keys(format!("making the certificate of `{name}`: {e}"));
    let mut names: Vec<String> = vec![name.to_string(), "localhost".into(), "127.0.0.1".into()];
    names.extend(hosts.iter().cloned());
    let mut p = CertificateParams::new(names).map_err(err)?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    (p.not_before, p.not_after) = (from, to);
    let key = KeyPair::generate().map_err(err)?;
    let cert = p.signed_by(&key, issuer).map_err(err)?;
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    write_file(&k, &key.serialize_pem(), true)?;
    write_file(&c, &cert.pem(), false)?;
    Ok((name.to_string(), c, k))
}

/// The names `reflex keys` puts in certificates: peers as bus names (their common name is what
/// `[bus.access]` lists; `ca` is the authority's own files), distinct; hosts as DNS names or IP
/// addresses. An empty `--peer ""` wrote hidden `.pem` / `.key` files.
fn check_names(peers: &[String], hosts: &[String]) -> Result<(), BusError> {
    let mut seen = std::collections::HashSet::new();
    for p in peers {
        if reflex_contracts::keys::Keys::new(p).is_err() || p == "ca" {
            return Err(BusError::Keys(format!(
                "peer name `{p}`: letters, digits, '-' and '_' only, not empty and not `ca` (the authority's files)"
            )));
        }
        if !seen.insert(p) {
            return Err(BusError::Keys(format!("peer `{p}` is named twice")));
        }
    }
    for h in hosts {
        let dns = !h.is_empty()
            && h.split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        if !dns && h.parse::<std::net::IpAddr>().is_err() {
            return Err(BusError::Keys(format!(
                "host `{h}`: a DNS name (robot.local) or an IP address (192.168.1.20)"
            )));
        }
    }
    Ok(())
}

/// Certificates for more peers of a robot whose keys `init_keys` made: signed by the authority in
/// `dir` (`ca.pem`, `ca.key`, the key readable by its owner only), so the robot and every other
/// peer accept them without new keys of their own. An existing peer is never overwritten.
pub fn add_peers(
    dir: &Path,
    peers: &[String],
    hosts: &[String],
    validity: &dyn Fn(&str) -> Validity,
) -> Result<Vec<(String, PathBuf, PathBuf)>, BusError> {
    check_names(peers, hosts)?;
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    for p in [&ca_pem, &ca_key] {
        if !p.is_file() {
            return Err(BusError::Keys(format!(
                "`{}` not found: `reflex keys add` signs with the robot's authority; run `reflex keys init` first, or point --dir at the directory it wrote",
                p.display()
            )));
        }
    }
    check_private(&ca_key)?;
    for name in peers {
        let c = dir.join(format!("{name}.pem"));
        if c.exists() {
            return Err(BusError::Keys(format!(
                "`{}` exists: peer `{name}` has a certificate already; remove its .pem and .key to issue a new one",
                c.display()
            )));
        }
    }
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|e| BusError::Keys(format!("`{}`: {e}", p.display())))
    };
    let key = rcgen::KeyPair::from_pem(&read(&ca_key)?)
        .map_err(|e| BusError::Keys(format!("`{}`: not a private key: {e}", ca_key.display())))?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&read(&ca_pem)?, key).map_err(|e| {
        BusError::Keys(format!(
            "`{}`: not a certificate authority: {e}",
            ca_pem.display()
        ))
    })?;
    peers
        .iter()
        .map(|name| issue_peer(dir, name, hosts, validity(name), &issuer))
        .collect()
}

/// Makes a certificate authority for `robot` and a certificate for every peer in `peers`
/// (its common name is its name), naming `hosts` (DNS names or IP addresses the robot is
/// reached at) beside `localhost` so a peer can check the robot's name. `validity(name)` says
/// how long each is valid (`"ca"` for the authority). Keys are written with mode 600. An
/// existing `ca.pem` is never overwritten: keys are made once per robot.
pub fn init_keys(
    dir: &Path,
    robot: &str,
    peers: &[String],
    hosts: &[String],
    validity: &dyn Fn(&str) -> Validity,
) -> Result<KeySet, BusError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let err = |e: rcgen::Error| BusError::Keys(format!("making certificates: {e}"));
    reflex_contracts::keys::Keys::new(robot)
        .map_err(|e| BusError::Keys(format!("--robot: {e}")))?;
    check_names(peers, hosts)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| BusError::Keys(format!("`{}`: {e}", dir.display())))?;
    let ca_pem = dir.join("ca.pem");
    if ca_pem.exists() {
        return Err(BusError::Keys(format!(
            "`{}` exists: these are the keys of a robot already; remove the directory to start over (every peer then needs new certificates)",
            ca_pem.display()
        )));
    }
    let (from, to) = validity("ca");
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, format!("reflex CA for {robot}"));
    ca.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    ca.not_before = from;
    ca.not_after = to;
    let ca_key = KeyPair::generate().map_err(err)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    write_file(&dir.join("ca.key"), &ca_key.serialize_pem(), true)?;
    write_file(&ca_pem, &ca_cert.pem(), false)?;
    let issuer = Issuer::new(ca, ca_key);
    let mut out = vec![];
    for name in peers {
        out.push(issue_peer(dir, name, hosts, validity(name), &issuer)?);
    }
    Ok(KeySet {
        ca: ca_pem,
        peers: out,
    })
}
