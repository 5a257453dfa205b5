//! One port, several gRPC services: a call whose path starts with a service's prefix goes to
//! it, every other call on (the port's own service last, which answers an unknown method
//! itself). tonic's router
//! would bring axum for these few choices.

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures_util::future::Either;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Service;

/// The calls of `grpc.health.v1.Health`.
pub const HEALTH: &str = "/grpc.health.v1.Health/";

/// Calls under `prefix` to `matched`, the others to `rest`.
#[derive(Clone)]
pub struct ByPath<M, R> {
    pub prefix: &'static str,
    pub matched: M,
    pub rest: R,
}

impl<M, R> Service<Request<Body>> for ByPath<M, R>
where
    M: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    R: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    /// Either service's own future: no allocation per call to choose.
    type Future = Either<M::Future, R::Future>;

    /// Both services are always ready (tonic's generated servers are).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if request.uri().path().starts_with(self.prefix) {
            Either::Left(self.matched.call(request))
        } else {
            Either::Right(self.rest.call(request))
        }
    }
}
