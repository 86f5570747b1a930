//! The files and directories the writer makes, made so that nothing it did not make
//! is ever written, replaced or closed:
//! - [`OwnFile`]: created with `O_CREAT | O_EXCL` (never a file that was there, nor
//!   the target of a link planted under its name), under a descriptor above the
//!   standard streams' (0, 1, 2, even while closed), and checked to be the same file
//!   before every write: a program that closes descriptors it does not own (a daemon
//!   closing everything from 3 up) and opens its own files may get one of our numbers;
//!   from then on nothing is written through that number and it is never closed.
//! - [`rename_new`]: a finished file is moved into place only where no file is.
//! - [`make_dirs`]: directories are created readable, writable and searchable by their
//!   owner, whatever the umask, so that the next process of the run can use them.
//! - [`locked_fds`]: the descriptors of the logs this process holds locked, so that a
//!   fork child lets go of them (a `flock` lock belongs to the open file, which a fork
//!   child shares: the parent's logs would stay locked, and out of `zcta recover`'s
//!   reach, for as long as a child it forked lives on after it).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// A file this process created, written only while its descriptor is still that file.
pub struct OwnFile {
    /// `None` only in `drop`.
    file: Option<File>,
    /// Device and inode at creation.
    id: (u64, u64),
    /// The slot of [`LOCKED`] holding its descriptor, while it holds a lock.
    locked: Option<usize>,
}

impl OwnFile {
    /// Creates `path`, which must not exist (a symbolic link there counts as existing,
    /// wherever it points): `AlreadyExists` otherwise.
    ///
    /// Its descriptor is never 0, 1 or 2: those are the program's standard streams even
    /// while it has them closed (a daemon, a launcher with closed stdio), and its writes
    /// there must fail as they would without zcta, not land in our file. A file opened
    /// under one of them is moved up at once (std's `try_clone`, `F_DUPFD_CLOEXEC`
    /// from 3) and the low number closed.
    pub fn create(path: &Path) -> io::Result<Self> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        if file.as_raw_fd() <= 2 {
            let moved = file.try_clone()?;
            if moved.as_raw_fd() <= 2 {
                return Err(io::Error::other("no file descriptor above the standard streams"));
            }
            file = moved;
        }
        let m = file.metadata()?;
        Ok(Self {
            id: (m.dev(), m.ino()),
            file: Some(file),
            locked: None,
        })
    }

    /// The file, while its descriptor still is it (one `fstat`).
    pub fn file(&self) -> Option<&File> {
        let f = self.file.as_ref()?;
        let m = f.metadata().ok()?;
        ((m.dev(), m.ino()) == self.id).then_some(f)
    }

    fn checked(&self) -> io::Result<&File> {
        self.file().ok_or_else(|| {
            io::Error::other(
                "zcta's file descriptor was closed by the program (and may be one of its own \
                 files now): nothing more is written through it",
            )
        })
    }

    /// Takes the file's `flock` lock without waiting (`zcta recover` leaves locked
    /// logs alone); a file system without locks just means no such protection.
    pub fn lock(&mut self) {
        if self.locked.is_some() {
            return;
        }
        let Some(f) = self.file() else { return };
        if f.try_lock().is_ok() {
            let fd = f.as_raw_fd();
            self.locked = LOCKED.iter().position(|s| {
                s.fd.compare_exchange(-1, -2, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            });
            if let Some(i) = self.locked {
                LOCKED[i].dev.store(self.id.0, Ordering::Relaxed);
                LOCKED[i].ino.store(self.id.1, Ordering::Relaxed);
                LOCKED[i].fd.store(fd, Ordering::Release);
            }
        }
    }
}

impl Write for OwnFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut f = self.checked()?;
        f.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for OwnFile {
    fn drop(&mut self) {
        if let Some(i) = self.locked.take() {
            LOCKED[i].fd.store(-1, Ordering::Release);
        }
        if self.file().is_none() {
            // The number is the program's now: left open.
            std::mem::forget(self.file.take());
        }
    }
}

/// A log this process holds locked: its descriptor (-1: a free slot; -2: being
/// filled) and the device and inode the descriptor must still name to be ours.
struct LockedLog {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

/// The logs this process holds locked. A log not registered for want of a slot keeps
/// its lock in a fork child too.
static LOCKED: [LockedLog; 64] = [const {
    LockedLog {
        fd: AtomicI32::new(-1),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
    }
}; 64];

/// Calls `f(fd, dev, inode)` for every log this process holds locked: the caller lets
/// go of a descriptor only while it still names that file (the program may have closed
/// ours and reused the number). Touches nothing but atomics: callable in a fork child
/// before it may allocate.
pub fn locked_fds(mut f: impl FnMut(i32, u64, u64)) {
    for s in &LOCKED {
        let fd = s.fd.load(Ordering::Acquire);
        if fd >= 0 {
            f(fd, s.dev.load(Ordering::Relaxed), s.ino.load(Ordering::Relaxed));
        }
    }
}

/// Forgets every registered descriptor (a fork child, once it has let go of them).
pub fn forget_locked_fds() {
    for s in &LOCKED {
        s.fd.store(-1, Ordering::Release);
    }
}

/// Renames `from` to `to` where no file is at `to` (`AlreadyExists` otherwise): a
/// hard link, which is never made over a file or through a link, then `from` removed.
/// On a file system without hard links, a look first and a plain rename (a file made
/// at `to` in between is then replaced).
pub fn rename_new(from: &Path, to: &Path) -> io::Result<()> {
    match fs::hard_link(from, to) {
        Ok(()) => fs::remove_file(from),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(e),
        Err(_) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(io::Error::from(io::ErrorKind::AlreadyExists));
            }
            fs::rename(from, to)
        }
    }
}

/// Creates `dir` and its missing parents. A directory made here gets read, write and
/// search for its owner whatever the umask (under `umask 0777` it would be of no use
/// even to the next process of the same run); other bits keep the umask's word. One
/// made by another process at the same moment is taken as it is.
pub fn make_dirs(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(p) = dir.parent()
        && !p.as_os_str().is_empty()
    {
        make_dirs(p)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => {
            // Looked at without following a link (one swapped in between is left
            // alone); a directory the umask left without read for its owner cannot be
            // opened, so it is changed by its path. Best effort: a mode that cannot
            // be changed leaves the directory as the umask made it.
            if let Ok(m) = fs::symlink_metadata(dir)
                && m.is_dir()
            {
                let mode = m.permissions().mode();
                if mode & 0o700 != 0o700 {
                    let _ = fs::set_permissions(dir, fs::Permissions::from_mode((mode | 0o700) & 0o7777));
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("zcta-files-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_planted_link_or_file_is_neither_followed_nor_replaced() {
        let d = tmpdir("plant");
        let victim = d.join("victim");
        fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("log")).unwrap();
        let e = OwnFile::create(&d.join("log")).err().expect("refused");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        fs::write(d.join("from"), b"ours").unwrap();
        let e = rename_new(&d.join("from"), &d.join("log")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(
            fs::symlink_metadata(d.join("log"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        rename_new(&d.join("from"), &d.join("to")).unwrap();
        assert_eq!(fs::read(d.join("to")).unwrap(), b"ours");
        let _ = fs::remove_dir_all(&d);
    }
}
