//! The daemon's own query parameters (`canonical::OWN_PARAMS`: an enqueue
//! token, a lane code) once the gate has read them: a browser let in or
//! queued is sent to the same address without them (`Shown::Clean`), so
//! they stay out of the origin's logs, the address bar, the history and
//! every `Referer`, through the reverse proxy and every decision-mode
//! proxy alike. Apps asking for JSON get their answer as before (they
//! send the headers instead); the reverse proxy takes the parameters out
//! of whatever it forwards (`proxy::Proxy::forward`).

use http::{HeaderMap, Method};

use super::pages::{Reply, Shown};
use super::{Admission, Answer, Ctx, Room};

impl Admission {
    /// `decision` for a request of `room`, or the redirect to its address
    /// without the daemon's parameters where it lets in or queues a
    /// browser that brought some.
    pub(super) fn cleaned(
        &self,
        room: &Room,
        decision: Answer,
        method: &Method,
        headers: &HeaderMap,
        ctx: &Ctx<'_>,
    ) -> Answer {
        if !matches!(decision, Answer::In(_) | Answer::Show(Shown::Queue { .. })) {
            return decision;
        }
        let Some(to) = ctx.canonical.without_own_params() else {
            return decision;
        };
        if Reply::for_room(room, headers).json {
            return decision;
        }
        let cookie = match decision {
            Answer::In(admitted) => admitted
                .ticket
                .map(|t| self.tickets.set_cookie(room, &t, ctx.now)),
            Answer::Show(Shown::Queue { cookie, .. }) => Some(cookie),
            other => return other,
        };
        Answer::Show(Shown::Clean {
            to: to.to_string(),
            cookie,
            keep_method: !matches!(*method, Method::GET | Method::HEAD),
        })
    }
}
