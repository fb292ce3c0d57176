package api

import (
	"context"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	"bcd/internal/catalog"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/metal"
)

type images struct{ svc *metal.Service }

func (h *images) AddSigner(ctx context.Context, req *connect.Request[bcdv1.AddSignerRequest]) (*connect.Response[bcdv1.AddSignerResponse], error) {
	s := req.Msg.GetSigner()
	if err := h.svc.AddSigner(ctx, principal(ctx), s.GetName(), s.GetPublicKey()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.AddSignerResponse{}), nil
}

func (h *images) RevokeSigner(ctx context.Context, req *connect.Request[bcdv1.RevokeSignerRequest]) (*connect.Response[bcdv1.RevokeSignerResponse], error) {
	if err := h.svc.RevokeSigner(ctx, principal(ctx), req.Msg.Name); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.RevokeSignerResponse{}), nil
}

func (h *images) ListSigners(ctx context.Context, req *connect.Request[bcdv1.ListSignersRequest]) (*connect.Response[bcdv1.ListSignersResponse], error) {
	if err := metal.Require(principal(ctx), auth.Read); err != nil {
		return nil, toConnect(err)
	}
	list, err := h.svc.Store().Signers(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListSignersResponse{}
	for _, s := range list {
		out.Signers = append(out.Signers, &bcdv1.Signer{Name: s.Name, PublicKey: s.PublicKey, Revoked: s.Revoked})
	}
	return connect.NewResponse(out), nil
}

func imageProto(img catalog.Image, verdict string) *bcdv1.Image {
	return &bcdv1.Image{Name: img.Name, Url: img.URL, Size: img.Size, Format: img.Format, Compression: img.Compression,
		Sha256: img.SHA256, Sha512: img.SHA512, Signer: img.Signer, Signature: img.Signature, Verdict: verdict}
}

func (h *images) AddImage(ctx context.Context, req *connect.Request[bcdv1.AddImageRequest]) (*connect.Response[bcdv1.AddImageResponse], error) {
	m := req.Msg.GetImage()
	img := catalog.Image{Name: m.GetName(), URL: m.GetUrl(), Size: m.GetSize(), Format: m.GetFormat(), Compression: m.GetCompression(),
		SHA256: m.GetSha256(), SHA512: m.GetSha512(), Signer: m.GetSigner(), Signature: m.GetSignature()}
	if err := h.svc.AddImage(ctx, principal(ctx), img); err != nil {
		return nil, toConnect(err)
	}
	verdict := ""
	if _, err := h.svc.Store().VerifiedImage(ctx, img.Name); err != nil {
		verdict = err.Error()
	}
	return connect.NewResponse(&bcdv1.AddImageResponse{Image: imageProto(img, verdict)}), nil
}

func (h *images) ListImages(ctx context.Context, req *connect.Request[bcdv1.ListImagesRequest]) (*connect.Response[bcdv1.ListImagesResponse], error) {
	list, verdicts, err := h.svc.Images(ctx, principal(ctx))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListImagesResponse{}
	for i, img := range list {
		out.Images = append(out.Images, imageProto(img, verdicts[i]))
	}
	return connect.NewResponse(out), nil
}
