//! One port, two gRPC services: the health service's calls (`/grpc.health.v1.Health/...`) go to
//! it, every other call to the RLS, which answers an unknown method itself. tonic's router would
//! bring axum for this one choice.

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Service};

const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

#[derive(Clone)]
pub struct Route<R, H> {
    pub rls: R,
    pub health: H,
}

impl<R, H> Service<Request<Body>> for Route<R, H>
where
    R: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    R::Future: Send + 'static,
    H: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    H::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Response<Body>, Infallible>;

    /// Both services are always ready (tonic's generated servers are).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if request.uri().path().starts_with(HEALTH_PATH) {
            Box::pin(self.health.call(request))
        } else {
            Box::pin(self.rls.call(request))
        }
    }
}
