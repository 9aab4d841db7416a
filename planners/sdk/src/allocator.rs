//! The planner's allocator (wasm32 only, feature `small-alloc`, on by default).
//!
//! A planner call allocates a handful of small blocks (the request's strings,
//! the names and keys it builds, the returned list) and frees them all before
//! the next call. Through the standard allocator each of those is four calls
//! deep (`__rust_alloc`, `__rdl_alloc`, wasi-libc's `malloc`, `dlmalloc`):
//! about 200 wasm instructions per allocation and as many per free, measured
//! at a quarter of a `binary-levels` plan. Here a block of up to
//! [`LARGEST`] bytes comes from, and returns to, a free list per power-of-two
//! size: a pop or a push. Larger blocks, and every block's first allocation,
//! go to the standard allocator, so the memory limit the host sets still
//! bounds everything.
//!
//! Blocks stay in their size class once made, so each list holds at most as
//! many blocks as were ever live at once in that class: memory is bounded by
//! the peak use, as with any allocator, plus the rounding to a power of two.
//!
//! A component instance is single-threaded (wasm32-wasip2 has no threads), so
//! the lists need no lock. A planner that wants another allocator turns the
//! feature off: `default-features = false`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;

/// The smallest class: a freed block must hold the free list's next pointer.
const SMALLEST_SHIFT: u32 = 3;
/// Blocks above this many bytes go straight to the standard allocator.
pub const LARGEST: usize = 1 << 10;
/// Every block's alignment; layouts asking for more go to the standard allocator.
const BLOCK_ALIGN: usize = 8;
const CLASSES: usize = (LARGEST.trailing_zeros() - SMALLEST_SHIFT + 1) as usize;

/// Free lists of small blocks, one per power-of-two size from 8 to [`LARGEST`] bytes.
pub struct SmallBlocks {
    free: [Cell<*mut u8>; CLASSES],
}

impl SmallBlocks {
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        SmallBlocks { free: [const { Cell::new(ptr::null_mut()) }; CLASSES] }
    }

    /// The class of a layout: the smallest power of two holding its size. A
    /// block of class `c` is `8 << c` bytes, aligned to 8.
    fn class(layout: Layout) -> Option<usize> {
        if layout.size() > LARGEST || layout.align() > BLOCK_ALIGN {
            return None;
        }
        let shift = layout.size().next_power_of_two().trailing_zeros().max(SMALLEST_SHIFT);
        Some((shift - SMALLEST_SHIFT) as usize)
    }

    fn block_layout(class: usize) -> Layout {
        Layout::from_size_align(1 << (class as u32 + SMALLEST_SHIFT), BLOCK_ALIGN).expect("a power of two up to LARGEST is a valid layout")
    }
}

// SAFETY: each method either works on the free lists of small blocks, which
// only ever hold blocks of their class's size and alignment (made by `System`
// with exactly that layout), or passes the call on to `System` unchanged.
// The same layout always maps to the same class, so a block freed with the
// layout it was allocated with goes back to the list it came from.
unsafe impl GlobalAlloc for SmallBlocks {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = Self::class(layout) else {
            // SAFETY: the caller's contract for `layout` is `System`'s.
            return unsafe { System.alloc(layout) };
        };
        let head = self.free[class].get();
        if head.is_null() {
            // SAFETY: the block layout has a non-zero size.
            return unsafe { System.alloc(Self::block_layout(class)) };
        }
        // SAFETY: a listed block is free, at least pointer-sized and aligned,
        // and holds the next block's address, written by `dealloc`.
        self.free[class].set(unsafe { head.cast::<*mut u8>().read() });
        head
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        match Self::class(layout) {
            Some(class) => {
                // SAFETY: the block came from this class (same layout) and is
                // now free: it may hold the list's next pointer.
                unsafe { block.cast::<*mut u8>().write(self.free[class].get()) };
                self.free[class].set(block);
            }
            // SAFETY: a block of this layout came from `System`.
            None => unsafe { System.dealloc(block, layout) },
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size`, rounded up to `layout.align()`, fits an isize.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (Self::class(layout), Self::class(new_layout)) {
            // The block already has room: it stays in its class.
            (Some(old), Some(new)) if old == new => block,
            // SAFETY: both layouts are `System`'s.
            (None, None) => unsafe { System.realloc(block, layout, new_size) },
            _ => {
                // SAFETY: a new block of the new layout, the contents copied, the old one freed.
                unsafe {
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                    moved
                }
            }
        }
    }
}

#[cfg(all(target_arch = "wasm32", feature = "small-alloc"))]
mod global {
    // A component instance runs on one thread; with the threads proposal the
    // lists would need a lock.
    #[cfg(target_feature = "atomics")]
    compile_error!("the small-alloc feature assumes a single-threaded planner; turn it off for a threaded wasm target");

    // SAFETY: single-threaded (see above), so the `Cell`s are never shared between threads.
    unsafe impl Sync for super::SmallBlocks {}

    #[global_allocator]
    static ALLOCATOR: super::SmallBlocks = super::SmallBlocks::new();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_map_to_power_of_two_classes_and_large_ones_to_none() {
        let class = |size, align| SmallBlocks::class(Layout::from_size_align(size, align).unwrap());
        assert_eq!(class(1, 1), Some(0));
        assert_eq!(class(8, 1), Some(0));
        assert_eq!(class(9, 1), Some(1));
        assert_eq!(class(16, 8), Some(1));
        assert_eq!(class(LARGEST, 1), Some(CLASSES - 1));
        assert_eq!(class(LARGEST + 1, 1), None);
        assert_eq!(class(8, 16), None, "more alignment than blocks have");
    }

    #[test]
    fn freed_blocks_are_reused_within_their_class_and_keep_their_alignment() {
        let blocks = SmallBlocks::new();
        let layout = Layout::from_size_align(24, 8).unwrap();
        unsafe {
            let a = blocks.alloc(layout);
            let b = blocks.alloc(layout);
            assert!(!a.is_null() && !b.is_null() && a != b);
            assert_eq!(a as usize % BLOCK_ALIGN, 0);
            blocks.dealloc(a, layout);
            blocks.dealloc(b, layout);
            // Last freed, first reused; a different size in the same class shares the list.
            assert_eq!(blocks.alloc(Layout::from_size_align(17, 1).unwrap()), b);
            assert_eq!(blocks.alloc(layout), a);
            let other = blocks.alloc(Layout::from_size_align(8, 8).unwrap());
            assert!(other != a && other != b, "another class has its own blocks");
        }
    }

    #[test]
    fn realloc_keeps_the_block_within_a_class_and_moves_the_contents_across() {
        let blocks = SmallBlocks::new();
        unsafe {
            let small = Layout::from_size_align(10, 1).unwrap();
            let p = blocks.alloc(small);
            p.copy_from_nonoverlapping(b"0123456789".as_ptr(), 10);
            assert_eq!(blocks.realloc(p, small, 16), p, "10 and 16 bytes share a class");
            let grown = blocks.realloc(p, Layout::from_size_align(16, 1).unwrap(), 100);
            assert_ne!(grown, p);
            assert_eq!(std::slice::from_raw_parts(grown, 10), b"0123456789");
            let large = blocks.realloc(grown, Layout::from_size_align(100, 1).unwrap(), 5_000);
            assert_eq!(std::slice::from_raw_parts(large, 10), b"0123456789");
            let back = blocks.realloc(large, Layout::from_size_align(5_000, 1).unwrap(), 12);
            assert_eq!(back, p, "the 16-byte block the first move freed is reused");
            assert_eq!(std::slice::from_raw_parts(back, 10), b"0123456789");
            blocks.dealloc(back, Layout::from_size_align(12, 1).unwrap());
            assert_eq!(blocks.alloc(Layout::from_size_align(9, 1).unwrap()), p);
        }
    }
}
