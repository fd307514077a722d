//! aarch64 feature detection that `std::arch::is_aarch64_feature_detected!` does not give on
//! this toolchain: the Scalable Matrix Extension, read from the kernel's `AT_HWCAP2` bits, and
//! its streaming vector length (`rdsvl`).

/// `getauxval` key of the second hardware-capability word.
const AT_HWCAP2: u64 = 26;
/// `HWCAP2_*` bits (Linux `arch/arm64/include/uapi/asm/hwcap.h`): SME itself, its 8-bit
/// integer outer products into 32-bit tiles, and its single-precision ones.
const HWCAP2_SME: u64 = 1 << 23;
const HWCAP2_SME_I8I32: u64 = 1 << 26;
const HWCAP2_SME_F32F32: u64 = 1 << 29;

extern "C" {
    /// glibc's auxiliary-vector reader.
    fn getauxval(key: u64) -> u64;
}

/// Whether the kernel reports SME with the int8 → int32 and f32 outer products (detected once).
pub fn has_sme() -> bool {
    static SME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SME.get_or_init(|| {
        // SAFETY: `getauxval` reads the process's auxiliary vector; any key is valid (an
        // absent one gives 0).
        let caps = unsafe { getauxval(AT_HWCAP2) };
        let need = HWCAP2_SME | HWCAP2_SME_I8I32 | HWCAP2_SME_F32F32;
        caps & need == need
    })
}

/// The streaming vector length in bytes (16..256; one ZA tile of 32-bit elements is
/// `bytes / 4` square). 0 without SME.
pub fn sme_vector_bytes() -> usize {
    static SVL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SVL.get_or_init(|| {
        if !has_sme() {
            return 0;
        }
        let bytes: u64;
        // SAFETY: SME is present (checked above); `rdsvl` reads the streaming vector length
        // without entering streaming mode and touches no other state.
        unsafe { std::arch::asm!(".arch_extension sme", "rdsvl {0}, #1", out(reg) bytes, options(nomem, nostack, preserves_flags)) };
        bytes as usize
    })
}
