//! Real `redis-server` processes that a test starts and stops itself.
//! Part of `tests/support`.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use tempfile::TempDir;

const MISSING: &str = "not found on the PATH (redis-server and redis-cli are both needed). The Redis backend's tests run \
    against a real server: install it (Debian/Ubuntu: `apt-get install redis-server`; \
    macOS: `brew install redis`) or run the tests without `--features redis`.";

/// Starts redis-server under a small shell watchdog: SIGTERM to the
/// returned child kills the server at once (as a crash would), and the server
/// also goes when this test process exits, even if it never ran `Drop`. Then
/// the watchdog removes `dir` too: a server held by a static (the shared
/// cluster) is never dropped, and each run left its directory in `/tmp`.
fn spawn(dir: &TempDir, args: &[String]) -> Child {
    for tool in ["redis-server", "redis-cli"] {
        let found = Command::new(tool).arg("--version").output();
        assert!(found.is_ok_and(|o| o.status.success()), "{tool}: {MISSING}");
    }
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "redis-server {} & pid=$!; trap 'kill -9 $pid; wait $pid; exit 0' TERM; \
         while kill -0 {parent} 2>/dev/null && kill -0 $pid 2>/dev/null; do sleep 0.2; done; \
         kill -9 $pid 2>/dev/null; wait $pid; \
         kill -0 {parent} 2>/dev/null || rm -rf -- '{dir}'; exit 0",
        quoted.join(" "),
        parent = std::process::id(),
        dir = dir.path().display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start sh for redis-server: {e}"))
}

fn terminate(child: &mut Child) {
    // Stopped already (a node a test killed, then Drop): `kill` would
    // complain of no such process, or reach a reused pid.
    if child.try_wait().is_ok_and(|done| done.is_some()) {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn cli(args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One redis-server on a unix socket in a temp dir, without persistence.
pub struct RedisServer {
    dir: TempDir,
    child: Option<Child>,
    /// Further `redis-server` arguments.
    extra: Vec<String>,
    /// The socket path.
    pub socket: PathBuf,
}

impl RedisServer {
    /// Starts a server and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with further arguments (such as `--databases 1`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = TempDir::new().unwrap();
        let socket = dir.path().join("redis.sock");
        let mut server = Self {
            dir,
            child: None,
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
            socket,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let args = [
            "--port",
            "0",
            "--unixsocket",
            self.socket.to_str().unwrap(),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(str::to_owned);
        let args: Vec<String> = args.into_iter().chain(self.extra.clone()).collect();
        self.child = Some(spawn(&self.dir, &args));
        let sock = self.socket.to_str().unwrap().to_owned();
        wait_until("redis-server to answer", || {
            cli(&["-s", &sock, "ping"]).is_some_and(|o| o.trim() == "PONG")
        });
    }

    /// The URL dedupd connects with.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket.display())
    }

    /// Stops the server at once (SIGKILL, as a crash would).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child);
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Its working directory: where it keeps its AOF and snapshot, when
    /// started with them.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops it cleanly (`SHUTDOWN`: its AOF synced, a snapshot taken where
    /// `save` is set) and waits for it to exit.
    pub fn shutdown(&mut self) {
        let sock = self.socket.to_str().unwrap().to_owned();
        let _ = cli(&["-s", &sock, "shutdown"]);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Starts it again in the same directory, after [`RedisServer::shutdown`]
    /// or [`RedisServer::stop`]: it loads what its files hold.
    pub fn start_again(&mut self) {
        self.launch();
    }

    /// `redis-cli ARGS` against it: its answer, trimmed (state no
    /// instance of dedupd writes, planted by a test).
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .arg("-s")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Starts it again on the same socket (empty: no persistence).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Three masters on loopback, joined into a Redis Cluster.
pub struct RedisCluster {
    dir: TempDir,
    children: Vec<Child>,
    /// `redis://127.0.0.1:{port}` of each node.
    pub nodes: Vec<String>,
}

impl RedisCluster {
    /// Starts three `--cluster-enabled yes` servers, joins them with
    /// `redis-cli --cluster create`, and waits for `cluster_state:ok`.
    pub fn start() -> Self {
        Self::start_with_replicas(0)
    }

    /// As [`RedisCluster::start`], with `replicas` replicas per master
    /// (`3 × (1 + replicas)` servers).
    pub fn start_with_replicas(replicas: usize) -> Self {
        let dir = TempDir::new().unwrap();
        let mut children = Vec::new();
        let mut ports = Vec::new();
        while ports.len() < 3 * (1 + replicas) {
            let port = super::ports::free_port();
            // The cluster bus uses port + 10000: it must be free too.
            if port > 55_000
                || ports.contains(&port)
                || TcpListener::bind(("127.0.0.1", port + 10_000)).is_err()
            {
                continue;
            }
            ports.push(port);
        }
        for port in &ports {
            let args = [
                "--port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                format!("nodes-{port}.conf"),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
            ];
            children.push(spawn(&dir, &args));
        }
        for port in &ports {
            let p = port.to_string();
            wait_until("a cluster node to answer", || {
                cli(&["-p", &p, "ping"]).is_some_and(|o| o.trim() == "PONG")
            });
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut create = vec!["--cluster", "create"];
        create.extend(addrs.iter().map(String::as_str));
        let replicas = replicas.to_string();
        create.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        assert!(cli(&create).is_some(), "redis-cli --cluster create failed");
        for port in &ports {
            let p = port.to_string();
            wait_until("cluster_state:ok", || {
                cli(&["-p", &p, "cluster", "info"]).is_some_and(|o| o.contains("cluster_state:ok"))
            });
        }
        Self {
            dir,
            children,
            nodes: ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect(),
        }
    }
}

impl RedisCluster {
    /// `redis-cli` against node `i` (by its place in [`RedisCluster::nodes`]).
    pub fn cli(&self, i: usize, args: &[&str]) -> Option<String> {
        let port = self.nodes[i].rsplit(':').next().unwrap().to_owned();
        let mut all = vec!["-p", port.as_str()];
        all.extend_from_slice(args);
        cli(&all)
    }

    /// Stops node `i` at once (SIGKILL, as a crash would).
    pub fn stop(&mut self, i: usize) {
        terminate(&mut self.children[i]);
    }

    /// Stops every replica at once (SIGKILL); the masters go on.
    pub fn stop_replicas(&mut self) {
        for i in 0..self.nodes.len() {
            if self
                .cli(i, &["role"])
                .is_some_and(|r| r.lines().next() == Some("slave"))
            {
                terminate(&mut self.children[i]);
            }
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            terminate(child);
        }
        let _ = &self.dir;
    }
}

/// Three `redis-sentinel`s on loopback watching one master as `mymaster`:
/// a quorum of two, a master down after 2 s of silence (1 s made a
/// loaded CI machine fail over a second time, back to the old master).
pub struct RedisSentinels {
    dir: TempDir,
    children: Vec<Child>,
    ports: Vec<u16>,
    /// `redis://127.0.0.1:{port}` of each sentinel.
    pub urls: Vec<String>,
}

impl RedisSentinels {
    /// The master's name they watch.
    pub const MASTER: &'static str = "mymaster";

    /// Starts three sentinels watching the master on `127.0.0.1:master_port`.
    pub fn start(master_port: u16) -> Self {
        let dir = TempDir::new().unwrap();
        let mut children = Vec::new();
        let mut ports = Vec::new();
        while ports.len() < 3 {
            let port = super::ports::free_port();
            if !ports.contains(&port) && port != master_port {
                ports.push(port);
            }
        }
        for port in &ports {
            // A sentinel rewrites its config file: one each, in the temp dir.
            let conf = dir.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\n\
                     sentinel monitor {m} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {m} 2000\n\
                     sentinel failover-timeout {m} 5000\n\
                     sentinel parallel-syncs {m} 1\n",
                    m = Self::MASTER
                ),
            )
            .unwrap();
            children.push(spawn(
                &dir,
                &[conf.to_str().unwrap().to_owned(), "--sentinel".into()],
            ));
        }
        for port in &ports {
            let p = port.to_string();
            wait_until("a sentinel to answer", || {
                cli(&["-p", &p, "ping"]).is_some_and(|o| o.trim() == "PONG")
            });
        }
        Self {
            dir,
            children,
            urls: ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect(),
            ports,
        }
    }

    /// The port of the master the sentinels name now.
    pub fn master_port(&self) -> Option<u16> {
        let p = self.ports[0].to_string();
        let out = cli(&[
            "-p",
            &p,
            "sentinel",
            "get-master-addr-by-name",
            Self::MASTER,
        ])?;
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Whether the master the sentinels name now has a replica in sync
    /// (whichever server that is: a second failover may have moved it).
    pub fn master_has_replica_online(&self) -> bool {
        self.master_port().is_some_and(|port| {
            cli(&["-p", &port.to_string(), "info", "replication"])
                .is_some_and(|o| o.contains("state=online"))
        })
    }

    /// Who is master and who follows, for a failure message.
    pub fn describe(&self, ports: &[u16]) -> String {
        let mut out = format!("sentinels name {:?} master;", self.master_port());
        for port in ports {
            let info = cli(&["-p", &port.to_string(), "info", "replication"]).unwrap_or_default();
            let role: Vec<&str> = info
                .lines()
                .filter(|l| {
                    l.starts_with("role:")
                        || l.starts_with("master_port:")
                        || l.starts_with("master_link_status:")
                        || l.starts_with("slave0:")
                })
                .map(str::trim)
                .collect();
            out.push_str(&format!(" {port}: {}", role.join(" ")));
        }
        out
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for child in &mut self.children {
            terminate(child);
        }
        let _ = &self.dir;
    }
}
