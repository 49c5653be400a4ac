//! Training-time augmentation (`--augment`) and the evaluation transform, with torchvision's
//! semantics: CIFAR's random crop with 4-pixel zero padding and horizontal flip; ImageNet's
//! random-resized crop (scale 0.08–1, ratio 3/4–4/3, ten tries, then a centre crop) and flip;
//! resize and centre crop for evaluation.
//!
//! Every random draw comes from the sample's position in the run's sample stream (the global
//! count of samples drawn before it) and the run's seed, never from a generator that advances
//! with the process: a run gives the same augmented batches on any number of ranks, with any
//! batch-size schedule, and after a resume, bit for bit.

use clap::ValueEnum;
use lsgd_codec::rng::{self, Rng};
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// Which augmentation the training batches get (evaluation never augments).
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Augment {
    /// The images as they are (image folders: resized and centre-cropped as for evaluation).
    #[default]
    None,
    /// Random crop of the image size from the image padded by 4 zero pixels on each side, then
    /// a horizontal flip with probability ½ (He et al. 2016, §4.2).
    Cifar,
    /// Random-resized crop (scale 0.08–1 of the area, aspect ratio 3/4–4/3) resized to the image
    /// size, then a horizontal flip with probability ½ (Szegedy et al. 2015, torchvision's
    /// `RandomResizedCrop`); image folders only.
    Imagenet,
}

impl std::fmt::Display for Augment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.to_possible_value().expect("no variant is skipped");
        f.write_str(name.get_name())
    }
}

/// CIFAR's padding on each side, in pixels.
pub const CIFAR_PAD: i64 = 4;

/// The random number generator of one sample's augmentation: the codecs' SplitMix64
/// (`lsgd_codec::rng`), the same on every platform, seeded from (run seed, stream position).
#[derive(Debug, Clone)]
pub struct SampleRng(Rng);

impl SampleRng {
    /// The generator of the sample at `position` in the sample stream of a run seeded `seed`.
    pub fn new(seed: u64, position: u64) -> Self {
        // The seed is mixed before the position enters, so that nearby (seed, position)
        // pairs do not start from related states.
        let state =
            rng::mix(seed ^ 0x6c73_6764_6175_676d) ^ position.wrapping_mul(0xD1B5_4A32_D192_ED03);
        SampleRng(Rng::new(state))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in [0, n), 1 ≤ n < 2³² (image sides and offsets).
    pub fn below(&mut self, n: u64) -> u64 {
        u64::from(self.0.below(n as u32))
    }

    /// True with probability ½.
    pub fn coin(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }
}

/// A window of an image: top row, left column, height, width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crop {
    /// First row.
    pub top: usize,
    /// First column.
    pub left: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

/// torchvision's `RandomResizedCrop.get_params` with scale (0.08, 1) and ratio (3/4, 4/3): ten
/// tries at a window of a random share of the area and a log-uniform aspect ratio that fits,
/// else the largest centre window whose ratio is within the range.
pub fn random_resized_crop(rng: &mut SampleRng, width: usize, height: usize) -> Crop {
    const SCALE: (f64, f64) = (0.08, 1.0);
    const RATIO: (f64, f64) = (3.0 / 4.0, 4.0 / 3.0);
    let area = (width * height) as f64;
    let (log_lo, log_hi) = (RATIO.0.ln(), RATIO.1.ln());
    for _ in 0..10 {
        let target = area * rng.uniform(SCALE.0, SCALE.1);
        let ratio = rng.uniform(log_lo, log_hi).exp();
        let w = (target * ratio).sqrt().round_ties_even() as usize;
        let h = (target / ratio).sqrt().round_ties_even() as usize;
        if 0 < w && w <= width && 0 < h && h <= height {
            let top = rng.below((height - h + 1) as u64) as usize;
            let left = rng.below((width - w + 1) as u64) as usize;
            return Crop {
                top,
                left,
                height: h,
                width: w,
            };
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < RATIO.0 {
        (width, (width as f64 / RATIO.0).round_ties_even() as usize)
    } else if in_ratio > RATIO.1 {
        ((height as f64 * RATIO.1).round_ties_even() as usize, height)
    } else {
        (width, height)
    };
    Crop {
        top: (height - h) / 2,
        left: (width - w) / 2,
        height: h,
        width: w,
    }
}

/// The evaluation transform's geometry, torchvision's `Resize(round(size · 256/224))` then
/// `CenterCrop(size)`: the shorter side scaled to `resize`, the longer in proportion
/// (truncated, as torchvision), then the centre `size × size` window of that.
pub fn resize_then_centre(width: usize, height: usize, size: usize) -> ((usize, usize), Crop) {
    let resize = (size as f64 * 256.0 / 224.0).round_ties_even() as usize;
    let (w, h) = if width <= height {
        (
            resize,
            (resize as f64 * height as f64 / width as f64) as usize,
        )
    } else {
        (
            (resize as f64 * width as f64 / height as f64) as usize,
            resize,
        )
    };
    let crop = Crop {
        top: ((h as f64 - size as f64) / 2.0).round_ties_even() as usize,
        left: ((w as f64 - size as f64) / 2.0).round_ties_even() as usize,
        height: size,
        width: size,
    };
    ((w, h), crop)
}

/// One sample's CIFAR draws: the crop's offset in the padded image (0 ..= 2·pad each way) and
/// whether to flip.
pub fn cifar_draws(rng: &mut SampleRng) -> (i64, i64, bool) {
    let span = (2 * CIFAR_PAD + 1) as u64;
    let top = rng.below(span) as i64;
    let left = rng.below(span) as i64;
    (top, left, rng.coin())
}

/// CIFAR augmentation of a batch of raw images `[b, c, h, w]` (pixels before normalisation,
/// so the padding is black as torchvision pads the PIL image): sample `i` is cropped at
/// `draws[i]`'s offset from the zero-padded image and flipped if it says so.
pub fn pad_crop_flip(images: &Tensor, draws: &[(i64, i64, bool)]) -> Tensor {
    let (h, w) = (images.size()[2], images.size()[3]);
    let padded = images.constant_pad_nd([CIFAR_PAD, CIFAR_PAD, CIFAR_PAD, CIFAR_PAD]);
    let crops: Vec<Tensor> = draws
        .iter()
        .enumerate()
        .map(|(i, &(top, left, flip))| {
            let crop = padded.get(i as i64).narrow(1, top, h).narrow(2, left, w);
            if flip { crop.flip([2]) } else { crop }
        })
        .collect();
    Tensor::stack(&crops, 0)
}

/// An HWC RGB byte image as CHW floats in [0, 1], what `ToTensor` makes of it.
pub fn hwc_to_chw_unit(pixels: &[u8], width: usize, height: usize) -> Vec<f32> {
    let plane = width * height;
    let mut out = vec![0.0f32; 3 * plane];
    for (p, rgb) in pixels.chunks_exact(3).enumerate() {
        for c in 0..3 {
            out[c * plane + p] = f32::from(rgb[c]) / 255.0;
        }
    }
    out
}

/// Per-channel mean and standard deviation (unbiased) of raw images `[n, c, h, w]`, shaped
/// `[1, c, 1, 1]` for broadcasting; a constant channel gets a standard deviation of 1e-6 rather
/// than 0.
pub fn channel_stats(images: &Tensor) -> (Tensor, Tensor) {
    let c = images.size()[1];
    let (mut means, mut stds) = (Vec::new(), Vec::new());
    for ch in 0..c {
        // Each channel is reduced on its own, which for one channel is exactly the reduction of
        // the whole tensor the trainer made before data sets had channels.
        let plane = images.select(1, ch);
        means.push(plane.mean(Kind::Float));
        stds.push(plane.std(true).clamp_min(1e-6));
    }
    let shape = [1, c, 1, 1];
    (
        Tensor::stack(&means, 0).view(shape),
        Tensor::stack(&stds, 0).view(shape),
    )
}

/// ImageNet's per-channel mean and standard deviation (torchvision's constants), for image
/// folders, whose statistics would take a pass decoding every image.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// See [`IMAGENET_MEAN`].
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_depends_on_seed_and_position_only() {
        let a: Vec<u64> = (0..4).map(|_| SampleRng::new(7, 12).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            SampleRng::new(7, 12).next_u64(),
            SampleRng::new(7, 13).next_u64()
        );
        assert_ne!(
            SampleRng::new(7, 12).next_u64(),
            SampleRng::new(8, 12).next_u64()
        );
    }

    #[test]
    fn below_and_unit_stay_in_range_and_cover_it() {
        let mut rng = SampleRng::new(1, 2);
        let mut seen = [0u32; 9];
        for _ in 0..9000 {
            seen[rng.below(9) as usize] += 1;
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    }

    #[test]
    fn random_resized_crops_fit_and_follow_the_ranges() {
        for position in 0..2000 {
            let mut rng = SampleRng::new(3, position);
            let (w, h) = (200 + (position as usize % 57), 150);
            let c = random_resized_crop(&mut rng, w, h);
            assert!(c.width >= 1 && c.height >= 1);
            assert!(c.left + c.width <= w && c.top + c.height <= h, "{c:?}");
            let share = (c.width * c.height) as f64 / (w * h) as f64;
            assert!(share > 0.07 && share <= 1.0, "{share}");
        }
    }

    #[test]
    fn random_resized_crop_falls_back_to_a_centre_crop_of_a_thin_image() {
        // A 1000×10 strip: no window of ratio ≤ 4/3 and area ≥ 8 % fits, so the fallback takes
        // the full height and a 4:3 width.
        let mut rng = SampleRng::new(0, 0);
        let c = random_resized_crop(&mut rng, 1000, 10);
        assert_eq!(
            c,
            Crop {
                top: 0,
                left: (1000 - 13) / 2,
                height: 10,
                width: 13
            }
        );
    }

    #[test]
    fn evaluation_geometry_is_torchvisions() {
        // Resize(256) of 500×375 (w×h): 341×256, centre 224 from (58, 16): Python rounds
        // 58.5 to even.
        let ((w, h), c) = resize_then_centre(500, 375, 224);
        assert_eq!((w, h), (341, 256));
        assert_eq!((c.left, c.top, c.width, c.height), (58, 16, 224, 224));
    }

    #[test]
    fn cifar_crops_stay_inside_the_padding_and_flip_half_the_time() {
        let mut flips = 0;
        for position in 0..4000 {
            let (top, left, flip) = cifar_draws(&mut SampleRng::new(5, position));
            assert!((0..=2 * CIFAR_PAD).contains(&top) && (0..=2 * CIFAR_PAD).contains(&left));
            flips += u32::from(flip);
        }
        assert!((1800..2200).contains(&flips), "{flips}");
    }

    #[test]
    fn pad_crop_flip_moves_pixels_as_drawn() {
        // One 1×3×3 image 1..9; offset (4, 4) is the unpadded image, (0, 0) shows the padding.
        let x = Tensor::arange(9, (Kind::Float, tch::Device::Cpu)).view([1, 1, 3, 3]) + 1.0;
        let same = pad_crop_flip(&x, &[(4, 4, false)]);
        assert!(same.equal(&x));
        let flipped = pad_crop_flip(&x, &[(4, 4, true)]);
        assert_eq!(
            Vec::<f32>::try_from(flipped.flatten(0, -1)).unwrap()[..3],
            [3.0, 2.0, 1.0]
        );
        let corner = pad_crop_flip(&x, &[(3, 3, false)]);
        let v = Vec::<f32>::try_from(corner.flatten(0, -1)).unwrap();
        assert_eq!(v, [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 4.0, 5.0]);
    }

    #[test]
    fn chw_conversion() {
        let chw = hwc_to_chw_unit(&[255, 0, 51, 0, 255, 102], 2, 1);
        assert_eq!(chw, [1.0, 0.0, 0.0, 1.0, 0.2, 0.4]);
    }

    #[test]
    fn channel_stats_reduce_each_channel() {
        let x =
            Tensor::from_slice(&[0.0f32, 2.0, 10.0, 10.0, 4.0, 6.0, 10.0, 10.0]).view([2, 2, 1, 2]);
        let (mean, std) = channel_stats(&x);
        assert_eq!(mean.size(), [1, 2, 1, 1]);
        assert_eq!(
            Vec::<f32>::try_from(mean.flatten(0, -1)).unwrap(),
            [3.0, 10.0]
        );
        let s = Vec::<f32>::try_from(std.flatten(0, -1)).unwrap();
        assert!(
            (s[0] - (20.0f32 / 3.0).sqrt()).abs() < 1e-6 && s[1] == 1e-6,
            "{s:?}"
        );
    }
}
