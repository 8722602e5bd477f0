//! The boot ID: which boot an allocation was made under. The kernel makes a new one at
//! every boot, so an allocation whose boot ID is not the current one belongs to a pod the
//! reboot killed.

use std::path::Path;

use super::error::{Result, StateError};
use super::fs::Fs;

/// Where Linux publishes the boot ID.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The boot ID in `path` ([`BOOT_ID_PATH`]; a test passes its own file).
pub fn read_boot_id(fs: &dyn Fs, path: &Path) -> Result<String> {
    let bytes = fs
        .read(path)
        .map_err(StateError::io("read the boot ID", path))?;
    let id = String::from_utf8_lossy(&bytes).trim().to_owned();
    if id.is_empty() {
        return Err(StateError::EmptyBootId {
            path: path.to_owned(),
        });
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{RecordingFs, StdFs};

    #[test]
    fn the_boot_id_is_read_trimmed_and_an_empty_one_refused() {
        let fs = RecordingFs::new();
        fs.put("/proc/boot_id", "3b0f4c5e-1d2a-4e6f-9a8b-7c6d5e4f3a2b\n");
        let id = read_boot_id(&fs, Path::new("/proc/boot_id")).expect("boot id");
        assert_eq!(id, "3b0f4c5e-1d2a-4e6f-9a8b-7c6d5e4f3a2b");
        fs.put("/proc/empty", "\n");
        let err = read_boot_id(&fs, Path::new("/proc/empty")).expect_err("empty");
        assert!(matches!(err, StateError::EmptyBootId { .. }), "{err:?}");
    }

    #[test]
    fn this_machine_has_a_boot_id() {
        let id = read_boot_id(&StdFs, Path::new(BOOT_ID_PATH)).expect("Linux boot id");
        assert_eq!(id.len(), 36, "{id}");
    }
}
