//! `record`'s bookkeeping thread: one [`Book`] fed with the
//! [`BookMsg`]s of the server and the workers until [`BookMsg::Finish`].

use std::sync::mpsc::Receiver;
use std::time::Instant;

use anyhow::anyhow;

use super::book_msg::BookMsg;
use super::bookkeeper::{Book, BookkeeperOptions, BookkeeperShared};
use super::costs::Costs;

/// Runs the bookkeeping thread until [`BookMsg::Finish`].
pub fn run(rx: Receiver<BookMsg>, shared: BookkeeperShared, options: BookkeeperOptions) {
    let counters = std::sync::Arc::clone(&shared.counters);
    let costs = &counters.costs;
    let mut book = match Book::open(shared, options) {
        Ok(b) => b,
        Err(e) => {
            drain_until_finish(rx, e);
            return;
        }
    };
    while let Ok(msg) = rx.recv() {
        // One clock read per message: a batch of up to a thousand records.
        let started = Instant::now();
        match msg {
            BookMsg::Session(event) => {
                book.handle(*event);
                Costs::add_time(&costs.book_ns, started.elapsed());
            }
            BookMsg::Dump(asked) => {
                book.dump_at(asked);
                Costs::add_time(&costs.dump_ns, started.elapsed());
            }
            BookMsg::Service(_) => {}
            BookMsg::Finish(reply, named) => {
                let result = book.finish_telling(named);
                Costs::add_time(&costs.dump_ns, started.elapsed());
                let _ = reply.send(result);
                return;
            }
        }
    }
}

fn drain_until_finish(rx: Receiver<BookMsg>, error: String) {
    while let Ok(msg) = rx.recv() {
        if let BookMsg::Finish(reply, _) = msg {
            let _ = reply.send(Err(anyhow!(error)));
            return;
        }
    }
}
