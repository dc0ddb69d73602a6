//! `record`'s bookkeeping thread: one [`Book`] fed with the
//! [`BookMsg`]s of the server and the workers until [`BookMsg::Finish`].

use std::sync::mpsc::Receiver;

use anyhow::anyhow;

use super::book_msg::BookMsg;
use super::bookkeeper::{Book, BookkeeperOptions, BookkeeperShared};

/// Runs the bookkeeping thread until [`BookMsg::Finish`].
pub fn run(rx: Receiver<BookMsg>, shared: BookkeeperShared, options: BookkeeperOptions) {
    let mut book = match Book::open(shared, options) {
        Ok(b) => b,
        Err(e) => {
            drain_until_finish(rx, e);
            return;
        }
    };
    while let Ok(msg) = rx.recv() {
        match msg {
            BookMsg::Session(event) => book.handle(*event),
            BookMsg::Dump(asked) => book.dump_at(asked),
            BookMsg::Service(_) => {}
            BookMsg::Finish(reply) => {
                let _ = reply.send(book.finish());
                return;
            }
        }
    }
}

fn drain_until_finish(rx: Receiver<BookMsg>, error: String) {
    while let Ok(msg) = rx.recv() {
        if let BookMsg::Finish(reply) = msg {
            let _ = reply.send(Err(anyhow!(error)));
            return;
        }
    }
}
