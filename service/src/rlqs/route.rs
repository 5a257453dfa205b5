//! The RLQS beside the RLS on one port: calls to `/envoy.service.rate_limit_quota.v3.` go to
//! the RLQS, every other call on.

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures_util::future::Either;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Service;

const RLQS_PATH: &str = "/envoy.service.rate_limit_quota.v3.";

#[derive(Clone)]
pub struct WithRlqs<Q, R> {
    pub rlqs: Q,
    pub rest: R,
}

impl<Q, R> Service<Request<Body>> for WithRlqs<Q, R>
where
    Q: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    R: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<Q::Future, R::Future>;

    /// Both services are always ready (tonic's generated servers are).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if request.uri().path().starts_with(RLQS_PATH) {
            Either::Left(self.rlqs.call(request))
        } else {
            Either::Right(self.rest.call(request))
        }
    }
}
