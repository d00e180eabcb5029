//! HTTP the way an attacker writes it: raw bytes on a TCP socket, and the
//! response read back as bytes, so nothing on the client side normalizes,
//! merges or refuses what is being tested.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response as read off the socket.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the fake origin answered (and not the daemon).
    pub fn answered_by_origin(&self) -> bool {
        self.header("x-origin").is_some()
    }

    /// The path the origin would have served (`served` in its echo).
    pub fn served(&self) -> Option<String> {
        let echo: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        echo["served"].as_str().map(str::to_owned)
    }

    pub fn echo(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

/// Sends `request` as is and reads one response (the request should ask
/// for `Connection: close`; reading stops at the end of the first response
/// or when the server closes). Bounded: 10 s.
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> RawResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_response(&mut stream).await
}

/// Reads one response from `stream`.
pub async fn read_response(stream: &mut TcpStream) -> RawResponse {
    read_responses(stream, 1).await.remove(0)
}

/// Reads `n` responses from `stream`, as pipelined answers arrive: one
/// read may carry more than one of them. A response the server closed
/// before has status 0. Bounded: 10 s.
pub async fn read_responses(stream: &mut TcpStream, n: usize) -> Vec<RawResponse> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let read = async {
        let mut chunk = [0u8; 16 * 1024];
        let mut open = true;
        while out.len() < n {
            if let Some((resp, used)) = parse(&buf) {
                out.push(resp);
                buf.drain(..used);
                continue;
            }
            if !open {
                out.push(closed(&buf));
                buf.clear();
                continue;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => open = false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the responses within 10 s");
    out
}

fn closed(buf: &[u8]) -> RawResponse {
    RawResponse {
        status: 0,
        headers: Vec::new(),
        body: String::from_utf8_lossy(buf).into_owned(),
    }
}

/// A complete response at the start of `buf`, if there is one, and the
/// bytes it took.
fn parse(buf: &[u8]) -> Option<(RawResponse, usize)> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &buf[head_end + 4..];
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let (body, body_len) = if let Some(len) = header("content-length") {
        let len: usize = len.parse().ok()?;
        if rest.len() < len {
            return None;
        }
        (rest[..len].to_vec(), len)
    } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        dechunk(rest)?
    } else if status == 101 || status == 204 || status == 304 {
        (Vec::new(), 0)
    } else {
        return None;
    };
    let resp = RawResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    Some((resp, head_end + 4 + body_len))
}

/// A chunked body (without trailers) and the bytes it took.
fn dechunk(whole: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut rest = whole;
    let mut out = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).ok()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            // The empty trailer section ends with one more CRLF.
            let used = whole.len() - rest.len() + 2.min(rest.len());
            return Some((out, used));
        }
        if rest.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
