//! One port, two gRPC services: the health service's calls (`/grpc.health.v1.Health/...`) go to
//! it, every other call to the RLS, which answers an unknown method itself. tonic's router would
//! bring axum for this one choice.

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures_util::future::Either;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Service;

const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

#[derive(Clone)]
pub struct Route<R, H> {
    pub rls: R,
    pub health: H,
}

impl<R, H> Service<Request<Body>> for Route<R, H>
where
    R: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    H: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    /// Either service's own future: no allocation per call to choose.
    type Future = Either<R::Future, H::Future>;

    /// Both services are always ready (tonic's generated servers are).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if request.uri().path().starts_with(HEALTH_PATH) {
            Either::Right(self.health.call(request))
        } else {
            Either::Left(self.rls.call(request))
        }
    }
}
