//! A small RGB raster with lines, rectangles and 8×8 bitmap text, encoded as PNG. Drawing our
//! own keeps plots independent of system fonts, which a fresh machine may not have.

use anyhow::{Context, Result};
use font8x8::UnicodeFonts;
use std::path::Path;

pub type Rgb = [u8; 3];

pub struct Canvas {
    pub width: usize,
    pub height: usize,
    pixels: Vec<Rgb>,
}

impl Canvas {
    pub fn new(width: usize, height: usize, background: Rgb) -> Self {
        Canvas {
            width,
            height,
            pixels: vec![background; width * height],
        }
    }

    #[cfg(test)]
    pub fn pixel(&self, x: usize, y: usize) -> Rgb {
        self.pixels[y * self.width + x]
    }

    pub fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            self.pixels[y as usize * self.width + x as usize] = c;
        }
    }

    pub fn rect(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb) {
        for x in x0..=x1 {
            self.set(x, y0, c);
            self.set(x, y1, c);
        }
        for y in y0..=y1 {
            self.set(x0, y, c);
            self.set(x1, y, c);
        }
    }

    /// A line `thickness` pixels wide (Bresenham, thickened with a square brush).
    pub fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: Rgb, thickness: i64) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        let r = thickness / 2;
        loop {
            for ox in -r..=r {
                for oy in -r..=r {
                    self.set(x + ox, y + oy, c);
                }
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text with its top-left corner at (x, y), each font pixel drawn `scale`×`scale`.
    pub fn text(&mut self, x: i64, y: i64, s: &str, c: Rgb, scale: i64) {
        for (i, ch) in s.chars().enumerate() {
            let glyph = font8x8::BASIC_FONTS
                .get(ch)
                .or_else(|| font8x8::BASIC_FONTS.get('?'));
            let Some(rows) = glyph else { continue };
            let gx = x + i as i64 * 8 * scale;
            for (row, bits) in rows.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        for dx in 0..scale {
                            for dy in 0..scale {
                                self.set(gx + col * scale + dx, y + row as i64 * scale + dy, c);
                            }
                        }
                    }
                }
            }
        }
    }

    pub fn text_width(s: &str, scale: i64) -> i64 {
        s.chars().count() as i64 * 8 * scale
    }

    pub fn save_png(&self, path: &Path) -> Result<()> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut enc = png::Encoder::new(
            std::io::BufWriter::new(file),
            self.width as u32,
            self.height as u32,
        );
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header()?;
        let bytes: Vec<u8> = self.pixels.iter().flatten().copied().collect();
        writer.write_image_data(&bytes)?;
        Ok(())
    }
}
