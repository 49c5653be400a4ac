//! Decodes and transforms image files off the training thread (image folders): a pool of
//! threads works through requested samples while the trainer computes, so a batch the trainer
//! asked for a step ahead is ready when it needs it. A sample's result depends only on its
//! file and its [`Transform`] (which carries the augmentation's stream position), so it does
//! not matter which thread made it or when.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use image::RgbImage;
use image::imageops::{self, FilterType};
use tch::Tensor;

use crate::augment::{self, Crop, SampleRng};
use crate::data::{self, DataError};

/// What is done to one decoded image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transform {
    /// Resize the shorter side to `size · 256/224`, then the centre `size × size` window.
    Eval,
    /// ImageNet's random-resized crop and flip, drawn from the run `seed` and the sample's
    /// stream `position`.
    RandomResizedCrop {
        /// The run's seed.
        seed: u64,
        /// The sample's position in the run's sample stream.
        position: u64,
    },
}

/// One sample to make: which image, how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    /// Index of the image in the split.
    pub index: usize,
    /// What to do to it.
    pub transform: Transform,
}

/// A made sample: `3 × size × size` floats in [0, 1], or why the image could not be used.
type Made = Result<Vec<f32>, DataError>;

/// Work for a thread of the pool.
struct Job {
    path: PathBuf,
    transform: Transform,
    reply: mpsc::Sender<Made>,
}

/// A pool of threads decoding one split's image files to `size × size` RGB.
pub struct FileLoader {
    paths: Arc<[PathBuf]>,
    size: usize,
    jobs: Option<mpsc::Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    pending: HashMap<Key, mpsc::Receiver<Made>>,
}

impl std::fmt::Debug for FileLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileLoader")
            .field("images", &self.paths.len())
            .field("size", &self.size)
            .field("threads", &self.workers.len())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl FileLoader {
    /// A loader of `paths` making `size × size` images on `threads` threads (at least one).
    pub fn new(paths: Vec<PathBuf>, size: usize, threads: usize) -> Self {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let workers = (0..threads.max(1))
            .map(|i| {
                let queue = Arc::clone(&queue);
                std::thread::Builder::new()
                    .name(format!("lsgd-loader-{i}"))
                    .spawn(move || {
                        loop {
                            // The lock is held only to take a job, not while decoding it.
                            let job = match queue.lock() {
                                Ok(q) => q.recv(),
                                Err(_) => return,
                            };
                            let Ok(job) = job else { return };
                            let made = make(&job.path, job.transform, size);
                            // The trainer may have stopped waiting (an error elsewhere).
                            let _ = job.reply.send(made);
                        }
                    })
                    .expect("spawning a loader thread")
            })
            .collect();
        FileLoader {
            paths: paths.into(),
            size,
            jobs: Some(jobs),
            workers,
            pending: HashMap::new(),
        }
    }

    /// Starts making `keys` that are not already under way.
    pub fn request(&mut self, keys: &[Key]) {
        let Some(jobs) = &self.jobs else { return };
        for &key in keys {
            if self.pending.contains_key(&key) {
                continue;
            }
            let (reply, result) = mpsc::channel();
            let job = Job {
                path: self.paths[key.index].clone(),
                transform: key.transform,
                reply,
            };
            if jobs.send(job).is_ok() {
                self.pending.insert(key, result);
            }
        }
    }

    /// The images of `keys` as one `[n, 3, size, size]` tensor of raw pixels in [0, 1],
    /// waiting for those still being made; requests made for other samples of a training
    /// stream before the first of `keys` are dropped (a guess at a batch that did not come).
    pub fn take(&mut self, keys: &[Key]) -> Result<Tensor, DataError> {
        self.request(keys);
        let mut pixels = Vec::with_capacity(keys.len() * 3 * self.size * self.size);
        for key in keys {
            let made = match self.pending.remove(key) {
                Some(result) => result.recv().unwrap_or_else(|_| {
                    // A thread died (a panic in a decoder): make it here, which reports why.
                    make(&self.paths[key.index], key.transform, self.size)
                }),
                None => make(&self.paths[key.index], key.transform, self.size),
            };
            pixels.extend(made?);
        }
        if let Some(first) = keys.iter().filter_map(|k| position(k.transform)).min() {
            self.pending
                .retain(|k, _| position(k.transform).is_none_or(|p| p >= first));
        }
        let s = self.size as i64;
        Ok(Tensor::from_slice(&pixels).view([keys.len() as i64, 3, s, s]))
    }
}

impl Drop for FileLoader {
    fn drop(&mut self) {
        self.jobs = None;
        self.pending.clear();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The stream position of a training transform.
fn position(t: Transform) -> Option<u64> {
    match t {
        Transform::Eval => None,
        Transform::RandomResizedCrop { position, .. } => Some(position),
    }
}

/// Decodes `path` and transforms it to `3 × size × size` floats in [0, 1].
fn make(path: &std::path::Path, transform: Transform, size: usize) -> Made {
    let rgb = data::decode(path)?;
    let (width, height) = (rgb.width, rgb.height);
    let image = RgbImage::from_raw(width as u32, height as u32, rgb.pixels)
        .expect("decode returns width × height × 3 bytes");
    let out = match transform {
        Transform::Eval => {
            let ((w, h), crop) = augment::resize_then_centre(width, height, size);
            let resized = imageops::resize(&image, w as u32, h as u32, FilterType::Triangle);
            cut(&resized, crop)
        }
        Transform::RandomResizedCrop { seed, position } => {
            let mut rng = SampleRng::new(seed, position);
            let crop = augment::random_resized_crop(&mut rng, width, height);
            let window = cut(&image, crop);
            let mut out = imageops::resize(&window, size as u32, size as u32, FilterType::Triangle);
            if rng.coin() {
                imageops::flip_horizontal_in_place(&mut out);
            }
            out
        }
    };
    Ok(augment::hwc_to_chw_unit(out.as_raw(), size, size))
}

/// The `crop` window of `image` as an image of its own.
fn cut(image: &RgbImage, crop: Crop) -> RgbImage {
    imageops::crop_imm(
        image,
        crop.left as u32,
        crop.top as u32,
        crop.width as u32,
        crop.height as u32,
    )
    .to_image()
}
