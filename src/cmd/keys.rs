//! `reflex keys`: the certificates of a TLS bus.

use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum KeysCommand {
    /// A certificate authority for a robot and a certificate for each of its peers, for TLS with
    /// mutual authentication on the bus (docs/deploy.md).
    Init(KeysInitArgs),
    /// Certificates for more peers (another operator's teleop, a second viewer), signed by the
    /// authority `keys init` made: nobody else needs new keys. Needs `ca.key` in --dir.
    Add(KeysAddArgs),
}

#[derive(Args)]
pub struct KeysAddArgs {
    /// The directory `reflex keys init` wrote (`ca.pem` and `ca.key`).
    #[arg(long, default_value = "keys")]
    dir: PathBuf,
    /// A new peer (repeatable); add its name to the robot's [bus.access] for a role.
    #[arg(long = "peer", value_name = "NAME", required = true)]
    peers: Vec<String>,
    /// A DNS name or IP address the peer is reached at (repeatable).
    #[arg(long = "host", value_name = "NAME")]
    hosts: Vec<String>,
    /// Days the certificates are valid.
    #[arg(long, default_value_t = 365, value_parser = crate::cli::days)]
    days: i64,
}

#[derive(Args)]
pub struct KeysInitArgs {
    /// The robot's name on the bus (named in the authority).
    #[arg(long)]
    robot: String,
    /// Where to write the keys (`ca.pem`, `ca.key`, `<peer>.pem`, `<peer>.key`).
    #[arg(long, default_value = "keys")]
    dir: PathBuf,
    /// A peer (repeatable): its name is its certificate's common name, e.g. robot, learner,
    /// teleop, viewer.
    #[arg(long = "peer", value_name = "NAME", required = true)]
    peers: Vec<String>,
    /// A DNS name or IP address the robot is reached at (repeatable).
    #[arg(long = "host", value_name = "NAME")]
    hosts: Vec<String>,
    /// Days the certificates are valid.
    #[arg(long, default_value_t = 365, value_parser = crate::cli::days)]
    days: i64,
}

pub fn keys(cmd: KeysCommand) -> anyhow::Result<()> {
    let a = match cmd {
        KeysCommand::Init(a) => a,
        KeysCommand::Add(a) => {
            let added = reflex_bus::secure::add_peers(&a.dir, &a.peers, &a.hosts, &|_| {
                reflex_bus::secure::valid_for_days(a.days)
            })?;
            for (name, cert, key) in &added {
                println!(
                    "peer `{name}`: {} and {} (mode 600), signed by {}",
                    cert.display(),
                    key.display(),
                    a.dir.join("ca.pem").display()
                );
            }
            println!(
                "copy ca.pem and the new pair to the peer; give it a role in the robot's [bus.access] (learners, teleops or viewers) and restart the robot's reflex"
            );
            return Ok(());
        }
    };
    let set = reflex_bus::secure::init_keys(&a.dir, &a.robot, &a.peers, &a.hosts, &|_| {
        reflex_bus::secure::valid_for_days(a.days)
    })?;
    println!(
        "certificate authority: {} (its key {} signs new peers: keep it off the robot)",
        set.ca.display(),
        a.dir.join("ca.key").display()
    );
    for (name, cert, key) in &set.peers {
        println!(
            "peer `{name}`: {} and {} (mode 600)",
            cert.display(),
            key.display()
        );
    }
    println!(
        "each peer: [bus] tls = {{ dir = \"{}\", name = \"NAME\" }} in its config, or --tls-dir {} --tls-name NAME; endpoints tls/HOST:PORT",
        a.dir.display(),
        a.dir.display()
    );
    Ok(())
}
