//! The CPU architectures the agent image is built for, and what differs between them: the
//! Debian packages (their own lock file), the multiarch library directory, the dynamic
//! linker, the ELF machine of every binary, and the Rust target the binary is built for.
//!
//! The names are the same in the three places they meet: Debian's architecture (`dpkg
//! --print-architecture`), the OCI image config's and index's `architecture` (image-spec
//! `config.md`, Go's `GOARCH`), and the Kubernetes node label `kubernetes.io/arch`.

use crate::Error;

/// An architecture of the agent image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// Every architecture the agent image's index carries, in its order.
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// Debian's, OCI's and Kubernetes' name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    pub fn parse(name: &str) -> Result<Arch, Error> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| Error::Input(format!("architecture {name:?}: amd64 or arm64")))
    }

    /// The lock file of its Debian packages, in the workspace.
    pub fn lock_file(self) -> &'static str {
        match self {
            Arch::Amd64 => "image/agent-debs.lock",
            Arch::Arm64 => "image/agent-debs-arm64.lock",
        }
    }

    /// Debian's multiarch library directory (merged `/usr`).
    pub fn lib_dir(self) -> &'static str {
        match self {
            Arch::Amd64 => "usr/lib/x86_64-linux-gnu",
            Arch::Arm64 => "usr/lib/aarch64-linux-gnu",
        }
    }

    /// The program interpreter (`PT_INTERP`) glibc's binaries name: the x86-64 and AArch64
    /// psABIs' paths, which Debian's libc6 provides.
    pub fn interpreter(self) -> &'static str {
        match self {
            Arch::Amd64 => "/lib64/ld-linux-x86-64.so.2",
            Arch::Arm64 => "/lib/ld-linux-aarch64.so.1",
        }
    }

    /// The ELF header's `e_machine` of its binaries (`EM_X86_64`, `EM_AARCH64`).
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => object::elf::EM_X86_64,
            Arch::Arm64 => object::elf::EM_AARCH64,
        }
    }

    /// The Rust target the agent is built for (`cargo build --target`).
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The architecture of an ELF file's `e_machine`, if it is one of these.
    pub fn of_elf_machine(machine: u16) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.elf_machine() == machine)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `e_machine` of a 64-bit little-endian ELF file, `None` if it is not one.
pub fn elf_machine(data: &[u8]) -> Option<u16> {
    use object::read::elf::FileHeader;
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    Some(header.e_machine.get(endian))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_this_binary_is_read() {
        for a in Arch::ALL {
            assert_eq!(Arch::parse(a.name()).unwrap(), a);
            assert_eq!(Arch::of_elf_machine(a.elf_machine()), Some(a));
        }
        assert!(Arch::parse("x86_64").is_err());
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let machine = elf_machine(&me).expect("an ELF file");
        let host = match std::env::consts::ARCH {
            "x86_64" => Some(Arch::Amd64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        };
        assert_eq!(Arch::of_elf_machine(machine), host);
        assert_eq!(elf_machine(b"#!/bin/sh\n"), None);
    }
}
