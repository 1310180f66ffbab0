//! The data dir on a small file system: uploads fail with
//! RESOURCE_EXHAUSTED, nothing is corrupted, and service resumes when space
//! returns.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spillway::proto;
use tonic::Code;

use crate::harness::*;

const FS_MIB: u64 = 64;
const BALLAST_MIB: usize = 16;

/// A mounted small file system; unmounted on drop.
struct SmallFs {
    dir: PathBuf,
    kind: String,
}

impl SmallFs {
    fn mount(at: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let tmpfs = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={FS_MIB}m"), "tmpfs"])
            .arg(at)
            .output();
        match tmpfs {
            Ok(o) if o.status.success() => Ok(Self {
                dir: at.to_owned(),
                kind: format!("tmpfs, size={FS_MIB}m"),
            }),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr).trim().to_owned();
                let img = at.with_extension("img");
                let loop_ok = Command::new("truncate")
                    .args(["-s", &format!("{FS_MIB}M")])
                    .arg(&img)
                    .status()
                    .is_ok_and(|s| s.success())
                    && Command::new("mkfs.ext4")
                        .arg("-q")
                        .arg(&img)
                        .status()
                        .is_ok_and(|s| s.success())
                    && Command::new("mount")
                        .args(["-o", "loop"])
                        .arg(&img)
                        .arg(at)
                        .status()
                        .is_ok_and(|s| s.success());
                if loop_ok {
                    return Ok(Self {
                        dir: at.to_owned(),
                        kind: format!("ext4 loop image, {FS_MIB} MiB"),
                    });
                }
                Err(format!(
                    "cannot mount a small file system: tmpfs said {why:?}, and a loop-mounted ext4 image failed too"
                ))
            }
            Err(e) => Err(format!("cannot run mount: {e}")),
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

pub async fn diskfull(opts: &Opts) -> Result<Outcome> {
    let mut out = Outcome::new("disk-full");
    let dir = tempfile::tempdir_in(&opts.work_dir)?;
    let fs = match SmallFs::mount(&dir.path().join("small")) {
        Ok(fs) => fs,
        Err(why) => return Ok(out.skip(why)),
    };
    out.figure(fs.kind.clone());
    let ballast = fs.dir.join("ballast");
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut junk = vec![0u8; BALLAST_MIB << 20];
    rng.fill_bytes(&mut junk);
    std::fs::write(&ballast, &junk)?;
    let config = write_config(opts, dir.path(), "")?;
    let data_dir = fs.dir.join("data");
    let mut server = Server::start(opts, &config, &data_dir, &dir.path().join("log")).await?;
    let sid = server.session(None).await?;
    let mut p = server.payloads().await?;
    let mut acked: Vec<(String, String)> = Vec::new();
    let mut codes = std::collections::BTreeMap::<String, u64>::new();
    let mut full_at = None;
    for i in 0..100 {
        let mut data = vec![0u8; 2 << 20];
        rng.fill_bytes(&mut data);
        match upload(&mut p, &sid, &format!("fill-{i}.bin"), &data).await {
            Ok(pl) => acked.push((pl.id, sha256_hex(&data))),
            Err(e) => {
                *codes.entry(format!("{:?}", e.code())).or_default() += 1;
                if e.code() != Code::ResourceExhausted {
                    out.notes
                        .push(format!("upload {i}: {:?}: {}", e.code(), e.message()));
                }
                full_at.get_or_insert(i);
                if codes.values().sum::<u64>() >= 5 {
                    break;
                }
            }
        }
    }
    out.figure(format!(
        "{} uploads of 2 MiB acknowledged before full; refusals {codes:?}",
        acked.len()
    ));
    out.check(
        !acked.is_empty() && full_at.is_some(),
        "the file system filled up",
    );
    out.check(
        codes.keys().all(|c| c == "ResourceExhausted"),
        "every refused upload got RESOURCE_EXHAUSTED",
    );
    // While full: reads still work, and nothing half-written is left.
    let temps = temp_files(&data_dir);
    out.check(
        temps.is_empty(),
        format!("no temporary files while full ({temps:?})"),
    );
    if let Some((id, _)) = acked.first() {
        let r = p
            .read(proto::ReadRequest {
                payload_id: id.clone(),
                max_bytes: 1024,
                range: None,
            })
            .await;
        out.check(
            r.is_ok(),
            format!(
                "Read works while the disk is full ({:?})",
                r.err().map(|e| e.code())
            ),
        );
    }
    out.check(server.alive(), "the server is still running");
    // Space returns.
    std::fs::remove_file(&ballast)?;
    let mut data = vec![0u8; 2 << 20];
    rng.fill_bytes(&mut data);
    match upload(&mut p, &sid, "after.bin", &data).await {
        Ok(pl) => {
            acked.push((pl.id, sha256_hex(&data)));
            out.check(true, "an upload succeeds once space returns");
        }
        Err(e) => out.check(
            false,
            format!(
                "an upload succeeds once space returns ({:?}: {})",
                e.code(),
                e.message()
            ),
        ),
    }
    // Nothing corrupted, before and after a restart.
    for pass in ["live", "after restart"] {
        if pass == "after restart" {
            server.stop();
            server = server.restart(&dir.path().join("log2")).await?;
            p = server.payloads().await?;
        }
        let mut bad = Vec::new();
        for (id, sha) in &acked {
            match download(&mut p, id).await {
                Ok(b) if sha256_hex(&b) == *sha => {}
                Ok(_) => bad.push(format!("{id}: bytes changed")),
                Err(e) => bad.push(format!("{id}: {:?}", e.code())),
            }
        }
        out.check(
            bad.is_empty(),
            format!(
                "{} acknowledged payloads intact ({pass}) {bad:?}",
                acked.len()
            ),
        );
        match verify_audit(&server).await {
            Ok(v) => out.check(
                v.ok,
                format!("audit chain verifies ({pass}, {} events)", v.events_checked),
            ),
            Err(e) => out.check(false, format!("VerifyAudit ({pass}): {e}")),
        }
        let orphans = orphan_check(&server).await?;
        out.check(
            orphans.is_empty(),
            format!("no orphan files ({pass}) {orphans:?}"),
        );
    }
    for l in server.log_problems() {
        out.notes.push(format!("server log: {l}"));
    }
    server.stop();
    drop(server);
    drop(fs);
    Ok(out)
}
