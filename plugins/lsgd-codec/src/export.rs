//! The macro that turns a [`Codec`](crate::Codec) into the exports of a component targeting
//! `codec-plugin`. Like `lsgd-policy`'s macros it expands next to `wit_bindgen::generate!`,
//! where the generated WIT types live.

/// Exports a [`Codec`](crate::Codec) from a crate that generated the `codec-plugin` world: of
/// `wit/v0.2.0` or `v0.3.0` with the codec alone, of `wit/v0.4.0` with `, state` (0.4's codec
/// interface carries the bucket's state in its meta, `stateful` in its properties, and
/// `next-state`, which calls [`Codec::next_state`](crate::Codec::next_state)).
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.2.0", world: "codec-plugin" });
/// lsgd_codec::export_codec!(lsgd_codec::int8::Int8);
///
/// wit_bindgen::generate!({ path: "../../wit/v0.4.0", world: "codec-plugin" });
/// lsgd_codec::export_codec!(lsgd_codec::powersgd::PowerSgd, state);
/// ```
#[macro_export]
macro_rules! export_codec {
    ($codec:ty) => {
        $crate::export_codec!(@export $codec, m p, [state: ::std::vec::Vec::new()], [], []);
    };
    ($codec:ty, state) => {
        $crate::export_codec!(@export $codec, m p, [state: m.state], [stateful: p.stateful], [
            fn next_state(
                meta: exports::lsgd::policy::codec::BucketMeta,
                agreed: ::std::vec::Vec<::std::vec::Vec<u8>>,
            ) -> ::core::result::Result<::std::vec::Vec<u8>, ::std::string::String> {
                let meta = __lsgd_meta(meta);
                __lsgd_with(|c| <$codec as $crate::Codec>::next_state(c, &meta, &agreed))
            }
        ]);
    };
    // `$m` and `$p` name the meta and the properties in the tokens the arms above pass in.
    (@export $codec:ty, $m:ident $p:ident, [$($meta_state:tt)*], [$($props:tt)*], [$($extra:tt)*]) => {
        $crate::lsgd_policy::__export_plugin!($codec);

        fn __lsgd_meta($m: exports::lsgd::policy::codec::BucketMeta) -> $crate::Meta {
            $crate::Meta {
                bucket: $m.bucket,
                step: $m.step,
                round: $m.round,
                len: $m.len,
                tensors: $m
                    .tensors
                    .into_iter()
                    .map(|t| $crate::TensorSlice {
                        name: t.name,
                        shape: t.shape,
                        tensor_offset: t.tensor_offset,
                        bucket_offset: t.bucket_offset,
                        len: t.len,
                    })
                    .collect(),
                shared_seed: $m.shared_seed,
                rank_seed: $m.rank_seed,
                $($meta_state)*
            }
        }

        impl exports::lsgd::policy::codec::Guest for __LsgdExport {
            fn properties() -> exports::lsgd::policy::codec::CodecProperties {
                use exports::lsgd::policy::codec::{Combine as C, Element as E};
                let $p = __lsgd_with(|c| <$codec as $crate::Codec>::properties(c));
                let element = |e: $crate::Element| match e {
                    $crate::Element::F32 => E::F32,
                    $crate::Element::F16 => E::F16,
                    $crate::Element::Bf16 => E::Bf16,
                };
                exports::lsgd::policy::codec::CodecProperties {
                    combine: match $p.combine {
                        $crate::Combine::Gather => C::Gather,
                        $crate::Combine::Sum(e) => C::Sum(element(e)),
                    },
                    rounds: $p.rounds,
                    $($props)*
                }
            }

            fn encode(
                meta: exports::lsgd::policy::codec::BucketMeta,
                data: ::std::vec::Vec<f32>,
                agreed: ::std::vec::Vec<::std::vec::Vec<u8>>,
            ) -> ::core::result::Result<::std::vec::Vec<u8>, ::std::string::String> {
                let meta = __lsgd_meta(meta);
                __lsgd_with(|c| <$codec as $crate::Codec>::encode(c, &meta, &data, &agreed))
            }

            fn decode(
                meta: exports::lsgd::policy::codec::BucketMeta,
                payloads: ::std::vec::Vec<::std::vec::Vec<u8>>,
            ) -> ::core::result::Result<::std::vec::Vec<f32>, ::std::string::String> {
                let meta = __lsgd_meta(meta);
                __lsgd_with(|c| <$codec as $crate::Codec>::decode(c, &meta, &payloads))
            }

            $($extra)*
        }

        export!(__LsgdExport);
    };
}
