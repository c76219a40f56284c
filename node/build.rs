//! Links the Node-API symbols the `.node` module takes from the Node.js process loading it.
fn main() {
    napi_build::setup();
}
