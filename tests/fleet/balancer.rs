//! The balancer in front of the fleet tests' replicas: Debian's nginx
//! (`make nginx` installs it; `SPILLWAY_NGINX` names another binary), run
//! with `-p DIR -c DIR/nginx.conf -g 'daemon off;'` on a free loopback port,
//! its pid file, logs and temp files all inside DIR.
//!
//! Its config is deploy/nginx.conf, the file operators get, with only these
//! changes ([`config_from_deploy`]): the listen address, the three upstream
//! servers' addresses, and lines that put the pid file, the logs and the
//! temp directories in DIR. Each replacement must match the shipped file
//! exactly once, and [`config_from_deploy`]'s test checks that every other
//! line is the shipped one, so the tests exercise what is shipped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shipped balancer config.
pub const SHIPPED: &str = include_str!("../../deploy/nginx.conf");

/// The placeholder upstream servers' addresses in [`SHIPPED`], in order.
const PLACEHOLDERS: [&str; 3] = ["10.0.0.11:50051", "10.0.0.12:50051", "10.0.0.13:50051"];

/// The shipped listen directive.
const LISTEN: &str = "listen 50051 http2;";

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "deploy/nginx.conf has {from:?} exactly once"
    );
    text.replacen(from, to, 1)
}

/// The lines [`config_from_deploy`] adds: where nginx keeps its files, and
/// an access log that names the replica each call went to.
fn added_lines(dir: &Path) -> (String, String) {
    let d = dir.display();
    let main = format!("pid {d}/nginx.pid;\nerror_log {d}/error.log info;\n");
    let http = format!(
        "    log_format spillway '$status $http_x_spillway_session $upstream_addr';\n    \
         access_log {d}/access.log spillway;\n    \
         client_body_temp_path {d}/client_body;\n    \
         proxy_temp_path {d}/proxy;\n    \
         fastcgi_temp_path {d}/fastcgi;\n    \
         uwsgi_temp_path {d}/uwsgi;\n    \
         scgi_temp_path {d}/scgi;\n"
    );
    (main, http)
}

/// deploy/nginx.conf listening on `listen`, balancing over `upstreams`,
/// with its files in `dir`.
pub fn config_from_deploy(listen: SocketAddr, upstreams: &[SocketAddr; 3], dir: &Path) -> String {
    let mut text = replace_once(SHIPPED, LISTEN, &format!("listen {listen} http2;"));
    for (placeholder, addr) in PLACEHOLDERS.iter().zip(upstreams) {
        text = replace_once(
            &text,
            &format!("server {placeholder} "),
            &format!("server {addr} "),
        );
    }
    let (main, http) = added_lines(dir);
    text = replace_once(&text, "\nhttp {\n", &format!("\n{main}http {{\n{http}"));
    text
}

/// The nginx binary.
fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SPILLWAY_NGINX") {
        return PathBuf::from(p);
    }
    let debian = PathBuf::from("/usr/sbin/nginx");
    if debian.exists() {
        debian
    } else {
        PathBuf::from("nginx")
    }
}

/// A running nginx in front of three replicas.
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    /// Where clients connect.
    pub addr: SocketAddr,
}

impl Nginx {
    /// Starts nginx in front of `upstreams` and waits until a gRPC health
    /// check through it answers SERVING.
    pub async fn start(upstreams: &[SocketAddr; 3]) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        // As root, nginx's workers run as nobody: let them reach the temp
        // directories (nginx makes them and gives them to the worker user).
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let addr: SocketAddr = format!("127.0.0.1:{}", crate::common::free_port())
            .parse()
            .unwrap();
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, config_from_deploy(addr, upstreams, dir.path())).unwrap();
        let child = Command::new(binary())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            // Before the config is read, nginx logs to its built-in path.
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {:?} (make nginx installs it): {e}", binary()));
        let mut nginx = Nginx { child, dir, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = nginx.child.try_wait().unwrap() {
                panic!("nginx exited with {status}: {}", nginx.error_log());
            }
            if crate::common::serving(addr).await {
                return nginx;
            }
            assert!(
                Instant::now() < deadline,
                "nginx did not pass a health check to the replicas: {}",
                nginx.error_log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// nginx's error log and stderr.
    pub fn error_log(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.path().join(name));
        format!(
            "{}{}",
            read("stderr.log").unwrap_or_default(),
            read("error.log").unwrap_or_default()
        )
    }

    /// The access log: one line per call, `STATUS SESSION UPSTREAMS` (the
    /// upstreams tried, in order, comma-separated).
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

impl crate::common::Connect for Nginx {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers, then exits.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_test_balancer_config_is_the_shipped_one_but_for_addresses_and_file_paths() {
    let dir = Path::new("/tmp/nginx-test-dir");
    let listen: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    let ups: [SocketAddr; 3] =
        ["127.0.0.1:4001", "127.0.0.1:4002", "127.0.0.1:4003"].map(|a| a.parse().unwrap());
    let generated = config_from_deploy(listen, &ups, dir);
    let (main, http) = added_lines(dir);
    let added: Vec<&str> = main.lines().chain(http.lines()).collect();
    // Drop the added lines and map the addresses back: the shipped file.
    let mut back: Vec<String> = Vec::new();
    for line in generated.lines() {
        if added.contains(&line) {
            continue;
        }
        let mut l = line.replace(&format!("listen {listen} http2;"), LISTEN);
        for (p, a) in PLACEHOLDERS.iter().zip(&ups) {
            l = l.replace(&format!("server {a} "), &format!("server {p} "));
        }
        back.push(l);
    }
    let shipped: Vec<&str> = SHIPPED.lines().collect();
    assert_eq!(back, shipped);
    // And the changes are there: nothing in it points outside `dir` or at
    // the placeholder addresses.
    assert!(generated.contains("server 127.0.0.1:4003 max_fails=1"));
    assert!(generated.contains("hash $spillway_key consistent;"));
    assert!(!generated.contains("10.0.0."));
    assert_eq!(generated.lines().count(), shipped.len() + added.len());
}
