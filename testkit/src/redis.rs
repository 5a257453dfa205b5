//! Real `redis-server` processes on 127.0.0.1: one node, or a three-node Cluster.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::resp::{Reply, Resp};
use crate::{free_port, wait_for, TempDir};

const START_ATTEMPTS: usize = 5;
const READY_WITHIN: Duration = Duration::from_secs(5);

/// One `redis-server`, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    extra: Vec<String>,
    dir: TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(free_port, &[])
    }

    /// Starts on a port from `pick_port`, trying again on another port if that one was taken
    /// in the meantime (tests run in parallel).
    pub fn start_with(mut pick_port: impl FnMut() -> u16, extra: &[&str]) -> RedisServer {
        for _ in 0..START_ATTEMPTS {
            let mut server = RedisServer {
                child: None,
                port: pick_port(),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                dir: TempDir::new("redis"),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start in {START_ATTEMPTS} attempts");
    }

    /// Spawns on `self.port` and waits for PONG; false if it died (port taken) or never answered.
    fn spawn(&mut self) -> bool {
        let dir = self.dir.path();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        let port = self.port;
        let child = self.child.as_mut().unwrap();
        let ready = wait_for(READY_WITHIN, || {
            if child.try_wait().ok().flatten().is_some() {
                return Some(false);
            }
            let pong = Resp::connect(port)
                .and_then(|mut c| c.try_cmd(&["PING"]))
                .ok()?;
            (pong == Reply::Status("PONG".into())).then_some(true)
        });
        if ready != Some(true) {
            self.stop();
        }
        ready == Some(true)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn client(&self) -> Resp {
        Resp::connect(self.port).unwrap()
    }

    /// Kills the server (the port stays reserved for `restart`).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A fresh, empty server on the same port: no data, no scripts.
    pub fn restart(&mut self) {
        self.stop();
        assert!(
            self.spawn(),
            "redis-server did not restart on port {}",
            self.port
        );
    }

    /// SIGSTOP: the port still accepts connections but nothing answers.
    pub fn freeze(&self) {
        self.signal(crate::SIGSTOP);
    }

    pub fn thaw(&self) {
        self.signal(crate::SIGCONT);
    }

    fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().unwrap().id();
        crate::send_signal(i32::try_from(pid).unwrap(), signal);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Three primaries, no replicas, slots spread by `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|n| {
                let config = format!("nodes-{n}.conf");
                // Relative to --dir, which is the node's own temp dir.
                RedisServer::start_with(
                    cluster_port,
                    &["--cluster-enabled", "yes", "--cluster-config-file", &config],
                )
            })
            .collect();
        let cluster = RedisCluster { nodes };
        cluster.create();
        cluster
    }

    fn create(&self) {
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-cli must be installed");
        let exited = wait_for(Duration::from_secs(30), || create.try_wait().ok().flatten());
        if exited.is_none() {
            let _ = create.kill();
            let _ = create.wait();
        }
        assert!(
            exited.is_some_and(|s| s.success()),
            "redis-cli --cluster create failed: {exited:?}"
        );
        let all_ok = wait_for(Duration::from_secs(15), || {
            self.nodes
                .iter()
                .all(|node| cluster_state_ok(node.port))
                .then_some(())
        });
        assert!(all_ok.is_some(), "cluster_state never became ok");
    }

    /// The service's `--redis-cluster` value.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        urls.join(",")
    }
}

fn cluster_state_ok(port: u16) -> bool {
    let info = Resp::connect(port).and_then(|mut c| c.try_cmd(&["CLUSTER", "INFO"]));
    matches!(info, Ok(Reply::Bulk(Some(text))) if text.contains("cluster_state:ok"))
}

/// A port that is free together with its cluster bus port (port + 10000).
fn cluster_port() -> u16 {
    let seed = RandomState::new().hash_one(Instant::now());
    (0..1000u64)
        .map(|i| 20_000 + ((seed.wrapping_add(i * 7919)) % 30_000) as u16)
        .find(|&port| {
            [port, port + 10_000]
                .iter()
                .all(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .expect("no free port pair for a cluster node")
}
