//! No kernel touches a byte outside its row: rows are placed flush against a
//! PROT_NONE guard page (before and after), so any over-read or over-write
//! faults. Every level, every type, several row lengths.

use turboquant_codec::kernels::{self, available_levels};
use turboquant_codec::testing::*;
use turboquant_codec::TqType;

/// A read-write region of `len` bytes that ends (or starts) exactly at a guard page.
struct Guarded {
    base: *mut u8,
    total: usize,
    page: usize,
}

impl Guarded {
    fn new(len: usize) -> Guarded {
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let body = len.div_ceil(page) * page;
        let total = body + 2 * page;
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as *mut u8;
        unsafe {
            assert_eq!(libc::mprotect(base as *mut _, page, libc::PROT_NONE), 0);
            assert_eq!(
                libc::mprotect(base.add(page + body) as *mut _, page, libc::PROT_NONE),
                0
            );
        }
        Guarded { base, total, page }
    }
    /// `len` bytes ending at the trailing guard page.
    fn tail(&self, len: usize) -> *mut u8 {
        unsafe { self.base.add(self.total - self.page - len) }
    }
    /// `len` bytes starting at the leading guard page.
    fn head(&self) -> *mut u8 {
        unsafe { self.base.add(self.page) }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.base as *mut _, self.total) };
    }
}

#[test]
fn kernels_stay_inside_their_rows() {
    let mut rng = TRng::new(12);
    for ty in TqType::ALL {
        for nb in [1usize, 2, 3, 7, 64] {
            let n = nb * 64;
            let bytes = rng.blocks(ty, nb);
            let x = rng.gauss_vec(n);
            let gq = Guarded::new(bytes.len());
            let gx = Guarded::new(n * 4);
            let gy = Guarded::new(n * 4);
            for at_end in [true, false] {
                let q = if at_end {
                    gq.tail(bytes.len())
                } else {
                    gq.head()
                };
                let xf = (if at_end { gx.tail(n * 4) } else { gx.head() }) as *mut f32;
                let yf = (if at_end { gy.tail(n * 4) } else { gy.head() }) as *mut f32;
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), q, bytes.len());
                    std::ptr::copy_nonoverlapping(x.as_ptr(), xf, n);
                    let qs = std::slice::from_raw_parts_mut(q, bytes.len());
                    let xs = std::slice::from_raw_parts_mut(xf, n);
                    let ys = std::slice::from_raw_parts_mut(yf, n);
                    for level in available_levels() {
                        kernels::dequantize_row_at(level, ty, qs, ys);
                        let _ = kernels::vec_dot_row_at(level, ty, qs, xs);
                        kernels::mad_row_at(level, ty, qs, ys, 0.5);
                    }
                    kernels::quantize_row(ty, xs, qs);
                }
            }
        }
    }
}
